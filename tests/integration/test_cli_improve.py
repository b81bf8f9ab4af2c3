"""`arithmech finetune` then `arithmech evaluate --delta` end to end on a tiny model, and their bad inputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from arithmech.cli import main


def _rows(n: int) -> str:
    rows = []
    for i in range(n):
        a, b = i % 7 + 1, i % 5 + 2
        question = f"Tom has {a} apples and gets {b} more. How many?"
        rows.append({"id": f"toy-{i}", "question": question, "answer": str(a + b),
                     "rationale": f"{a} + {b} = {a + b}.", "rationale_correct": True})  # fmt: skip
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_finetune_then_evaluate_with_the_delta(tiny_model_dir, tmp_path: Path, capsys) -> None:
    model = tiny_model_dir("llama")
    data = tmp_path / "train.jsonl"
    data.write_text(_rows(8))
    out = tmp_path / "ft"
    args = ["finetune", "--model", str(model), "--method", "precise", "--components", "1.0,2.1", "--data", str(data),
            "--batch-size", "4", "--micro-batch-size", "2", "--max-steps", "2", "--lr", "1e-2", "--target", "answer",
            "--no-chat-template", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert "precise: trained" in capsys.readouterr().out
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["config"]["components"] == ["1.0", "2.1"] and meta["counts"]["steps"] == 2
    trained = load_file(str(out / "delta.safetensors"))
    assert trained and all(torch.isfinite(t).all() for t in trained.values())

    bench = tmp_path / "bench.jsonl"
    bench.write_text(_rows(3))
    ev = tmp_path / "ev"
    args = ["evaluate", "--model", str(model), "--delta", str(out), "--benchmarks", str(bench), "--n-shot", "0",
            "--max-new-tokens", "4", "--out", str(ev), "--quiet"]  # fmt: skip
    assert main(args) == 0
    results = list(csv.DictReader((ev / "results.csv").open()))
    assert len(results) == 1 and int(results[0]["n"]) == 3


def test_bad_inputs(tiny_model_dir, tmp_path: Path, capsys) -> None:
    model = str(tiny_model_dir("llama"))
    assert main(["finetune", "--model", model, "--method", "precise"]) == 2
    assert "precise SFT needs heads" in capsys.readouterr().err
    assert main(["finetune", "--model", model, "--components", "99.0", "--quiet"]) == 2
    assert "99" in capsys.readouterr().err
    assert main(["finetune", "--model", model, "--from", str(tmp_path / "missing"), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = ["evaluate", "--model", model, "--benchmarks", str(empty), "--out", str(tmp_path / "e"), "--quiet"]
    assert main(args) == 2
    assert "empty" in capsys.readouterr().err.lower()
    assert main(["evaluate", "--model", model, "--benchmarks", "gsm9k", "--quiet"]) == 2
    assert "unknown benchmark 'gsm9k'" in capsys.readouterr().err
