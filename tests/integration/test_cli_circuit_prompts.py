"""`arithmech circuit`'s prompts: the answer filter's counts and refusal, and MIB's own dataset files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from arithmech.circuits import prompts as circuit_prompts
from arithmech.cli import main

from tiny_models import make_tiny_tokenizer

SMALL = ["--method", "random", "--n-prompts", "4", "--batch-size", "2", "--quiet"]


def _answers_when(answered):
    """A stand-in for the model's top tokens: C's leading digit for "Q: How much is A plus/minus B? A: " when
    answered(A, B), else "x"."""
    tok = make_tiny_tokenizer()

    def top_tokens_at(_view, rows, reads, _pad, _batch_size=32, progress=None):
        out = []
        for row, read in zip(rows, reads, strict=True):
            text = tok.decode(row[: read[0] + 1])
            a, b = (int(x) for x in re.findall(r"\d+", text)[:2])
            c = a + b if "plus" in text else a - b
            out.append([tok.convert_tokens_to_ids(str(c)[0] if answered(a, b) else "x")])
        return out

    return top_tokens_at


def test_the_answer_filter_is_counted_in_metadata_and_printout(
    tiny_model_dir, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(circuit_prompts, "top_tokens_at", _answers_when(lambda a, b: a % 2 == 0))
    out = tmp_path / "run"
    assert main(["circuit", "--model", str(tiny_model_dir("llama")), *SMALL, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "answer filter, addition: " in printed and "4 of 4 pairs pass" in printed
    counts = json.loads((out / "metadata.json").read_text())["answer_filter"]
    assert counts[0]["source"] == "addition" and counts[0]["kept"] == 4
    assert counts[0]["prompts_answered"] <= counts[0]["prompts_drawn"]
    for line in (out / "prompts.jsonl").read_text().splitlines():
        assert int(json.loads(line)["a"]) % 2 == 0


def test_too_few_answered_pairs_are_refused_in_one_sentence(tiny_model_dir, tmp_path: Path, capsys) -> None:
    """The random tiny model answers (almost) no MIB prompt."""
    code = main(["circuit", "--model", str(tiny_model_dir("llama")), *SMALL, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "survive the answer filter" in err and "Traceback" not in err
    assert "fewer than 4" in err and "addition:" in err


def _mib_file(path: Path, n: int) -> Path:
    """n addition rows in MIB's columns, with operands of two digits (equal token lengths)."""
    rows = []
    for i in range(n):
        a, b, a2, b2 = 10 + i, 20 + 2 * i, 30 + i, 40 + i
        rows.append({
            "prompt": f"Q: How much is {a} plus {b}? A:", "label": a + b, "operator": "+",
            "random_counterfactual": {"prompt": f"Q: How much is {a2} plus {b2}? A:", "label": a2 + b2},
        })  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mib_dataset_rows_go_through_the_same_filter(
    tiny_model_dir, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _mib_file(tmp_path / "mib.jsonl", 12)
    monkeypatch.setattr(circuit_prompts, "top_tokens_at", _answers_when(lambda a, b: a % 2 == 0 or a >= 30))
    out = tmp_path / "run"
    args = ["circuit", "--model", str(tiny_model_dir("llama")), "--mib-dataset", str(data), *SMALL]
    assert main([*args, "--out", str(out)]) == 0
    assert f"answer filter, {data} (addition): " in capsys.readouterr().out
    counts = json.loads((out / "metadata.json").read_text())["answer_filter"][0]
    assert counts["clean_missed"] >= 1 and counts["cf_missed"] == 0 and counts["kept"] == 6
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    expected = [f"Q: How much is {a} plus {20 + 2 * (a - 10)}? A: " for a in (10, 12, 14, 16)]
    assert [p["reference"] for p in prompts] == expected


def test_bad_mib_dataset_is_refused_before_the_model_loads(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "1+1=", "answer": 2}) + "\n")
    missing_model = str(tmp_path / "no-such-model")
    code = main(["circuit", "--model", missing_model, "--mib-dataset", str(bad), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "lacks MIB's column(s)" in err and "Traceback" not in err
