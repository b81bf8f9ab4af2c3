"""`arithmech circuit`'s prompts: find and test pairs, the answer filter's counts of each and its refusal, and MIB's
own dataset files (find on one split, evaluate on another, shared rows dropped)."""

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
    assert "answer filter (find), addition: " in printed and "answer filter (test), addition: " in printed
    assert printed.count("4 of 4 pairs pass") == 2
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["counts"] == {"find_pairs": 4, "test_pairs": 4}
    for part in ("find", "test"):
        [counts] = meta["answer_filter"][part]
        assert counts["source"] == "addition" and counts["kept"] == 4
        assert counts["prompts_answered"] <= counts["prompts_drawn"]
    for name in ("prompts.jsonl", "test_prompts.jsonl"):
        for line in (out / name).read_text().splitlines():
            assert int(json.loads(line)["a"]) % 2 == 0


def test_evaluating_into_the_folder_read_keeps_what_it_recorded(
    tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34.6: `--from X --out X` keeps X's answer filter counts, scoring settings and provenance."""
    monkeypatch.setattr(circuit_prompts, "top_tokens_at", _answers_when(lambda a, b: a % 2 == 0))
    out = tmp_path / "run"
    model = str(tiny_model_dir("llama"))
    assert main(["circuit", "--model", model, *SMALL, "--operations", "subtraction", "--out", str(out)]) == 0
    before = json.loads((out / "metadata.json").read_text())
    args = ["circuit", "--model", model, "--from", str(out), "--evaluate", "--percents", "10,100", "--batch-size", "2"]
    assert main([*args, "--quiet", "--out", str(out)]) == 0
    after = json.loads((out / "metadata.json").read_text())
    assert after["answer_filter"] == before["answer_filter"] and after["answer_filter"]["find"][0]["kept"] == 4
    for name in ("method", "n_prompts", "operations", "keep_incorrect"):
        assert after["config"][name] == before["config"][name], name
    assert after["config"]["evaluate"] is True and after["config"]["from_circuit"] == str(out)
    assert after["scored"] == {"folder": str(out), "created": before["created"], "git_sha": before["git_sha"],
                               "scores_s": before["timings"]["scores_s"]}  # fmt: skip
    for part in ("find", "test"):
        assert after["evaluation"][part].startswith(before["evaluation"][part] + ", read back from "), part
    assert "subtraction" in (out / "circuit.svg").read_text()  # the title names the folder's task


def test_too_few_test_pairs_are_refused_before_scoring(
    tiny_model_dir, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in model answers only prompts whose fact is in the find part: the test part is refused."""
    from arithmech.data.mib_facts import fact_part

    monkeypatch.setattr(circuit_prompts, "top_tokens_at",
                        _answers_when(lambda a, b: fact_part("addition", a, b, 0) == "find"))  # fmt: skip
    code = main(["circuit", "--model", str(tiny_model_dir("llama")), *SMALL, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "only 0 test pairs survive the answer filter" in err and "--test-prompts" in err
    assert not (tmp_path / "x" / "edges.json").exists()


def test_too_few_answered_pairs_are_refused_in_one_sentence(tiny_model_dir, tmp_path: Path, capsys) -> None:
    """The random tiny model answers (almost) no MIB prompt."""
    code = main(["circuit", "--model", str(tiny_model_dir("llama")), *SMALL, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "survive the answer filter" in err and "Traceback" not in err
    assert "fewer than 4" in err and "addition:" in err


def _row(a: int, b: int, a2: int, b2: int) -> dict:
    return {"prompt": f"Q: How much is {a} plus {b}? A:", "label": a + b, "operator": "+",
            "random_counterfactual": {"prompt": f"Q: How much is {a2} plus {b2}? A:", "label": a2 + b2}}  # fmt: skip


def _mib_file(path: Path, n: int, rows: list[dict] | None = None) -> Path:
    """n addition rows in MIB's columns, with operands of two digits (equal token lengths); or `rows`."""
    rows = rows or [_row(10 + i, 20 + 2 * i, 30 + i, 40 + i) for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mib_dataset_rows_go_through_the_same_filter(
    tiny_model_dir, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _mib_file(tmp_path / "mib.jsonl", 12)
    shared = [_row(10, 20, 55, 11), _row(56, 12, 31, 41), _row(57, 13, 10, 20)]  # a find row's clean, cf, clean
    held = _mib_file(tmp_path / "validation.jsonl", 0, [*shared, *(_row(50 + i, 11, 60 + i, 12) for i in range(3))])
    monkeypatch.setattr(circuit_prompts, "top_tokens_at", _answers_when(lambda a, b: a % 2 == 0 or a >= 30))
    out = tmp_path / "run"
    args = ["circuit", "--model", str(tiny_model_dir("llama")), "--mib-dataset", str(data), *SMALL]
    assert main([*args, "--mib-eval-dataset", str(held), "--test-prompts", "2", "--min-prompts", "2",
                 "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert f"answer filter (find), {data} (addition): " in printed and "answer filter (test)" in printed
    meta = json.loads((out / "metadata.json").read_text())
    [find], [test] = meta["answer_filter"]["find"], meta["answer_filter"]["test"]
    assert find["clean_missed"] >= 1 and find["cf_missed"] == 0 and find["kept"] == 6
    assert test["shared"] == meta["evaluation"]["shared_rows_dropped"] == 3 and test["kept"] == 3  # 2 used
    assert meta["counts"] == {"find_pairs": 4, "test_pairs": 2}
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    expected = [f"Q: How much is {a} plus {20 + 2 * (a - 10)}? A: " for a in (10, 12, 14, 16)]
    assert [p["reference"] for p in prompts] == expected
    find_texts = {p[k] for p in prompts for k in ("reference", "counterfactual")}
    tests = [json.loads(line) for line in (out / "test_prompts.jsonl").read_text().splitlines()]
    assert len(tests) == 2 and not find_texts & {p[k] for p in tests for k in ("reference", "counterfactual")}


def test_one_file_without_splits_needs_its_evaluation_rows(tmp_path: Path, capsys) -> None:
    data = _mib_file(tmp_path / "mib.jsonl", 4)
    missing_model = str(tmp_path / "no-such-model")
    code = main(["circuit", "--model", missing_model, "--mib-dataset", str(data), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "is one table without splits" in err and "--mib-eval-dataset" in err


def test_bad_mib_dataset_is_refused_before_the_model_loads(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "1+1=", "answer": 2}) + "\n")
    missing_model = str(tmp_path / "no-such-model")
    code = main(["circuit", "--model", missing_model, "--mib-dataset", str(bad), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "lacks MIB's column(s)" in err and "Traceback" not in err


def test_unusable_rows_are_named_by_reason(tiny_model_dir, tmp_path: Path, capsys) -> None:
    """Issue 34.10: rows no pair can be made of are counted by reason with their first row, without the advice about
    operands (a user's own file has none to choose)."""
    lengths = _row(12, 30, 1, 3)  # the counterfactual is shorter in tokens
    word = {**_row(12, 34, 25, 51), "label": "forty-six"}
    bare = {**_row(12, 34, 25, 51), "random_counterfactual": "Q: How much is 25 plus 51? A:"}
    data = _mib_file(tmp_path / "mine.jsonl", 0, [word, bare, lengths, lengths, lengths])
    args = ["circuit", "--model", str(tiny_model_dir("llama")), "--mib-dataset", str(data), "--in-sample", *SMALL]
    assert main([*args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "no find row of --mib-dataset can be scored" in err and "5 rows unusable: 3 have a counterfactual of " \
        "another token length (first: row 3)" in err, err
    assert "first: row 1" in err and "first: row 2" in err and "--max-operand" not in err, err


def test_a_mib_file_that_is_not_json_is_one_sentence(tmp_path: Path, capsys) -> None:
    """Issue 34.11: before the model loads, naming the file and the line."""
    bad = tmp_path / "mine.jsonl"
    bad.write_text(json.dumps(_row(12, 34, 25, 51)) + "\nnot json at all\n")
    missing_model = str(tmp_path / "no-such-model")
    args = ["circuit", "--model", missing_model, "--mib-dataset", str(bad), "--in-sample"]
    assert main([*args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "mine.jsonl', line 2: not JSON" in err, err


def test_every_long_loop_shows_a_bar_with_its_total(
    tiny_model_dir, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34.3: after the graph line, the answer check, the scoring passes, each sweep and the oracle each show
    a progress bar that ends at its total."""
    monkeypatch.setattr(circuit_prompts, "top_tokens_at", _answers_when(lambda a, b: a % 2 == 0))
    args = ["circuit", "--model", str(tiny_model_dir("llama")), "--method", "eap-ig", "--steps", "2", "--n-prompts",
            "4", "--batch-size", "2", "--evaluate", "--percents", "10,100", "--oracle", "2"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "run")]) == 0
    said = capsys.readouterr().err.replace("\r", "\n")
    for bar, total in (("checking answers (find, addition)", None), ("checking answers (test, addition)", None),
                       ("scoring edges (eap-ig)", 4), ("sweep of 2 sizes (eap-ig)", None),
                       ("oracle: exact edge scores", 8)):  # fmt: skip
        last = [line for line in said.splitlines() if line.startswith(bar)][-1]
        done = re.search(r"\| (\d+)/(\d+) \[", last)
        assert done is not None and done.group(1) == done.group(2), last  # ends at its total
        assert total is None or int(done.group(2)) == total, last
