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
    assert "answer filter, addition: " in printed and "4 of 4 pairs kept" in printed
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
