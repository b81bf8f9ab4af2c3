"""Mistakes researchers make in their own prompt files, and numbers that would be undefined (issue #12, part a).

Every refusal case gives the exact file `arithmech identify --prompts` reads and asserts exit status 2, one
"error:" line naming the lines, the cause and the fix, no traceback, and no file written. Every warning case
asserts the documented warning and a finished run. The undefined-number cases assert that no NaN or infinity
reaches any CSV or JSON file of the run folder, and what is written instead.

Two tokenizers: the tiny models' byte-level one (one token per byte, so "12" is "1", "2" as in SmolLM2's
digit-splitting tokenizer, and " 8" is a space then "8"), and `merging_tokenizer`, a byte-level BPE that
merges a space into a digit (" 8" is one token, as in GPT-2).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from arithmech.cli import main

from tiny_models import EOS_TOKEN, PAD_TOKEN, make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def pair(reference: str, answer: str, counterfactual: str | None = None) -> dict[str, str]:
    """A row whose counterfactual swaps "+" for "@" (same token length), unless given."""
    return {"reference": reference, "counterfactual": counterfactual or reference.replace("+", "@"), "answer": answer}


def jsonl(rows: list[dict[str, str]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


GOOD = pair("3 + 4 = ", "7")

# case id -> (file bytes, tokenizer, substrings the error line must hold: where, cause, fix)
REFUSED: dict[str, tuple[bytes, str, list[str]]] = {
    "multi-digit answer": (
        jsonl([GOOD, pair("9 + 3 = ", "12")]),
        "bytes",
        ["line 2 (1 of 2 pairs)", "more than one token", "only its first token would be scored", "'1', '2'",
         "score the answer token by token with --answer-digits"],
    ),
    "multi-digit answer, merging tokenizer": (
        jsonl([pair("9 + 3 = ", "12")]),
        "merging",
        ["line 1", "more than one token", "' 1', '2'", "--answer-digits", "single-token answer"],
    ),
    "answer with a leading space after '='": (
        jsonl([pair("4 + 4 =", " 8"), pair("1 + 2 =", " 3")]),
        "bytes",
        ["lines 1 and 2 (2 of 2 pairs)", "first token is a space", "predicting a space", "' ', '8'",
         "write the answer as '8' and end the reference with the space"],
    ),
    "answer with a leading space after '= '": (
        jsonl([pair("4 + 4 = ", " 8")]),
        "bytes",
        ["line 1", "the reference ends with a space and the answer starts with one", "write the answer as '8'"],
    ),
    "answer with a trailing space": (
        jsonl([pair("4 + 4 = ", "8 ")]),
        "bytes",
        ["line 1", "the answer ends with a space", "without it ('8')"],
    ),
    "counterfactual identical to the reference": (
        jsonl([GOOD, pair("4 + 4 = ", "8", "4 + 4 = "), pair("2 + 2 = ", "4", "2 + 2 = ")]),
        "bytes",
        ["lines 2 and 3 (2 of 3 lines)", "the counterfactual is the reference itself", "changes nothing",
         "change the operator in the counterfactual"],
    ),
    "counterfactual that tokenizes like the reference": (
        jsonl([pair("4 + 4 = ", "8", "4 + 4 =")]),  # the trailing space moves into " 8": both are "4 + 4 ="
        "merging",
        ["line 1", "tokenizes to the reference's tokens", "changes nothing the model sees", "change the operator"],
    ),
    "reference that already ends with the answer": (
        jsonl([pair("4 + 4 = 8", "8")]),
        "bytes",
        ["line 1", "already ends with the answer", "end the reference where the answer starts ('4 + 4 = ')"],
    ),
    "one reference, two answers": (
        jsonl([pair("4 + 4 = ", "8"), pair("4 + 4 = ", "9")]),
        "bytes",
        ["line 2 (1 of 2 lines)", "another answer on an earlier line", "'9' here, '8' on line 1",
         "one answer per reference"],
    ),
    "many bad lines: the first five and a count": (
        jsonl([GOOD] + [pair(f"9 + {b} = ", str(9 + b)) for b in range(1, 8)]),
        "bytes",
        ["lines 2, 3, 4, 5, 6 and 2 more (7 of 8 pairs)", "more than one token"],
    ),
    "every counterfactual of another token length": (
        jsonl([pair("1 + 1 = ", "2", "1 plus 1 = "), pair("2 + 1 = ", "3", "2 plus 1 = ")]),
        "bytes",
        ["all 2 prompt pairs were rejected", "different token length", "lines 1 and 2",
         "same number of tokens"],
    ),
    "lines that are not JSON, named with a count": (
        jsonl([GOOD]) + b"{broken\n" + jsonl([GOOD]) + b"not json\n",
        "bytes",
        ["lines 2 and 4 (2 of 4 lines)", "not JSON", "write one JSON object per line"],
    ),
    "UTF-16 file": (jsonl([GOOD]).decode().encode("utf-16"), "bytes", ["UTF-16 text, not UTF-8", "save it as UTF-8"]),
    "a binary file given as prompts": (b"GGUF\x03\x00\x00\x00" + bytes(64), "bytes", ["binary file, not JSONL"]),
    "Latin-1 text": (jsonl([GOOD]) + '{"reference": "é"}\n'.encode("latin-1"), "bytes", ["line 2 is not UTF-8"]),
}


def merging_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE that merges a space into a digit (" 8" is one token, as in GPT-2), so "= " cannot be
    followed by a digit token. 258 tokens, as the tiny models have: the ten merged tokens take the places of
    the bytes 0xF5-0xFE, which never occur in UTF-8 text."""
    space = chr(0x120)  # ByteLevel's symbol for the space byte
    unused = {chr(b) for b in range(0xF5, 0xFF)}  # printable Latin-1 bytes are their own ByteLevel symbols
    symbols = [s for s in sorted(pre_tokenizers.ByteLevel.alphabet()) if s not in unused]
    merged = [space + str(d) for d in range(10)]
    vocab = {s: i for i, s in enumerate(symbols + merged)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(space, str(d)) for d in range(10)]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([PAD_TOKEN, EOS_TOKEN])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, unk_token=None, padding_side="right",
        model_max_length=128,
    )  # fmt: skip


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """"bytes": the tiny llama; "merging": the same weights with `merging_tokenizer`."""
    merging = tmp_path_factory.mktemp("tiny-llama-merging")
    make_tiny_model("llama").save_pretrained(merging)
    tokenizer = merging_tokenizer()
    assert tokenizer.tokenize("4 + 4 = 8")[-1] == chr(0x120) + "8" and len(tokenizer) == 258
    tokenizer.save_pretrained(merging)
    return {"bytes": tiny_model_dir("llama"), "merging": merging}


def identify(model: Path, prompts: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str):
    code = main(["identify", "--model", str(model), "--prompts", str(prompts), "--out", str(out), "--quiet", *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("case", list(REFUSED))
def test_mistaken_prompt_file_is_refused(case: str, model_dirs: dict[str, Path], tmp_path: Path, capsys) -> None:
    content, tokenizer, expected = REFUSED[case]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(content)
    out = tmp_path / "run"
    code, _, stderr = identify(model_dirs[tokenizer], prompts, out, capsys)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, stderr
    assert str(prompts) in errors[0]
    for text in expected:
        assert text in errors[0], errors[0]
    assert "Traceback" not in stderr
    assert not out.exists()


# case id -> (file bytes, tokenizer, substrings of the warning); the run finishes
WARNED: dict[str, tuple[bytes, str, list[str]]] = {
    "a line repeated": (
        jsonl([GOOD, pair("1 + 2 = ", "3"), GOOD]),
        "bytes",
        ["line 3 (1 of 3 lines)", "repeat an earlier line exactly", "counts again in every mean"],
    ),
    "a counterfactual of another token length": (
        jsonl([GOOD, pair("1 + 1 = ", "2", "1 plus 1 = ")]),
        "bytes",
        ["line 2 (1 of 2 pairs)", "rejected", "different token length than the reference"],
    ),
    "the reference's trailing space moves into the answer (merging tokenizer)": (
        jsonl([pair("4 + 4 = ", "8"), pair("1 + 2 = ", "3")]),
        "merging",
        ["lines 1 and 2 (2 of 2 pairs)", "the reference's trailing space moved into the answer's token",
         "'4 + 4 =' and ' 8'"],
    ),
}


def assert_all_finite(folder: Path) -> None:
    """No NaN or infinity in any CSV, JSONL or JSON file of the folder (JSON parsed strictly)."""
    def refuse(token: str) -> None:
        raise AssertionError(f"a bare {token} in {path}")

    for path in folder.rglob("*"):
        if path.suffix == ".json":
            json.loads(path.read_text(), parse_constant=refuse)
        elif path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                json.loads(line, parse_constant=refuse)
        elif path.suffix == ".csv":
            cells = {c.strip().lower() for row in csv.reader(path.open()) for c in row}
            assert not cells & {"nan", "inf", "-inf", "infinity", "-infinity"}, path


@pytest.mark.parametrize("case", list(WARNED))
def test_prompt_file_change_is_warned(
    case: str, model_dirs: dict[str, Path], tmp_path: Path, capsys, caplog: pytest.LogCaptureFixture
) -> None:
    content, tokenizer, expected = WARNED[case]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(content)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        code, _, stderr = identify(model_dirs[tokenizer], prompts, out, capsys, "--keep-incorrect")
    assert code == 0, stderr
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    warnings = [w for w in warnings if str(prompts) in w]
    assert len(warnings) == 1, warnings
    for text in expected:
        assert text in warnings[0], warnings[0]
    assert (out / "metadata.json").is_file()
    assert_all_finite(out)


def test_byte_order_mark_is_read(model_dirs: dict[str, Path], tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"\xef\xbb\xbf" + jsonl([GOOD, pair("1 + 2 = ", "3")]))  # as Notepad saves "UTF-8 with BOM"
    out = tmp_path / "run"
    code, _, stderr = identify(model_dirs["bytes"], prompts, out, capsys, "--keep-incorrect")
    assert code == 0, stderr
    kept = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert [row["reference"] for row in kept] == [GOOD["reference"], "1 + 2 = "]


def test_undefined_numbers_are_empty_cells(model_dirs: dict[str, Path], tmp_path: Path, capsys) -> None:
    """A template none of whose pairs is kept has no accuracy; knockout with no random draws has no random-rank
    mean or spread. Both are empty cells, and no file of either folder holds a NaN."""
    templates = tmp_path / "templates.json"
    base = {"operation": "addition", "formation": "equation", "text": "{A} + {B} = ", "operator": "+"}
    templates.write_text(json.dumps([
        {**base, "id": "t-same-length", "counterfactual_operator": "@"},
        {**base, "id": "t-longer", "counterfactual_operator": "@@"},  # every pair rejected
    ]))  # fmt: skip
    run = tmp_path / "identify"
    args = ["identify", "--model", str(model_dirs["bytes"]), "--templates", str(templates), "--few-shot", "0"]
    assert main([*args, "--n-per-template", "4", "--keep-incorrect", "--out", str(run), "--quiet"]) == 0
    accuracy = {r["template_id"]: r for r in csv.DictReader((run / "template_accuracy.csv").open())}
    assert accuracy["t-longer"]["kept"] == "0" and accuracy["t-longer"]["accuracy"] == ""
    assert float(accuracy["t-same-length"]["accuracy"]) >= 0
    knockout = tmp_path / "knockout"
    args = ["knockout", "--model", str(model_dirs["bytes"]), "--from", str(run), "--n-random", "0"]
    capsys.readouterr()
    assert main([*args, "--max-k", "2", "--out", str(knockout), "--quiet"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr()
    assert "nan" not in printed.out and "n/a (--n-random 0)" in printed.out and "Traceback" not in printed.err
    summary = list(csv.DictReader((knockout / "knockout_summary.csv").open()))
    assert [(r["prompt_set"], r["k"]) for r in summary] == [("held_out", "1"), ("held_out", "2"), ("in_sample", "1"),
                                                             ("in_sample", "2")]  # fmt: skip
    for row in summary:
        assert float(row["effect_accuracy"]) >= 0
        assert row["random_accuracy_mean"] == row["random_accuracy_std"] == row["random_prob_mean"] == ""
    assert_all_finite(run)
    assert_all_finite(knockout)


def test_undefined_patching_effect_is_refused(model_dirs: dict[str, Path], tmp_path: Path, capsys, monkeypatch) -> None:
    """An answer logit of 0 (or NaN, e.g. a float16 overflow) leaves (patched - ref) / |ref| undefined there."""
    import arithmech.stages.identify as identify_stage

    real = identify_stage.path_patch

    def overflowing(*args, **kwargs):
        result = real(*args, **kwargs)
        result.ref_logit[1] = float("nan")  # the second prompt's answer logit overflowed
        return result

    monkeypatch.setattr(identify_stage, "path_patch", overflowing)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(jsonl([GOOD, pair("1 + 2 = ", "3"), pair("2 + 2 = ", "4")]))
    out = tmp_path / "run"
    code, _, stderr = identify(model_dirs["bytes"], prompts, out, capsys, "--keep-incorrect")
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, stderr
    for text in (f"prompt file {prompts}, line 2 (1 of 3 pairs)", "the path patching effect is undefined",
                 "logit is 0 or not finite", "--dtype float32"):  # fmt: skip
        assert text in errors[0], errors[0]
    assert "Traceback" not in stderr
    assert not [p for p in out.rglob("*") if p.is_file()]
