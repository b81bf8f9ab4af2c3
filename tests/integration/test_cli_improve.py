"""`arithmech finetune` then `arithmech evaluate --delta` end to end on a tiny model, and their bad inputs."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from arithmech.cli import main
from arithmech.finetune.delta import apply_delta
from arithmech.models.load import ModelConfig, load_model

from harness_tasks import CHOICE_TASK, choice_rows, direct_loglikelihood, write_choice_task


def _rows(n: int) -> str:
    rows = []
    for i in range(n):
        a, b = i % 7 + 1, i % 5 + 2
        question = f"Tom has {a} apples and gets {b} more. How many?"
        rows.append({"id": f"toy-{i}", "question": question, "answer": str(a + b),
                     "rationale": f"{a} + {b} = {a + b}.", "rationale_correct": True})  # fmt: skip
    return "".join(json.dumps(r) + "\n" for r in rows)


def _finetune(model: Path, tmp_path: Path) -> Path:
    """Precise SFT of heads 1.0 and 2.1 for two steps; the output folder (holding the delta)."""
    data = tmp_path / "train.jsonl"
    data.write_text(_rows(8))
    out = tmp_path / "ft"
    args = ["finetune", "--model", str(model), "--method", "precise", "--components", "1.0,2.1", "--data", str(data),
            "--batch-size", "4", "--micro-batch-size", "2", "--max-steps", "2", "--lr", "1e-2", "--target", "answer",
            "--no-chat-template", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    return out


def test_finetune_then_evaluate_with_the_delta(tiny_model_dir, tmp_path: Path, capsys) -> None:
    model = tiny_model_dir("llama")
    out = _finetune(model, tmp_path)
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


@pytest.mark.usefixtures("one_thread")
def test_evaluate_harness_tasks_with_the_delta(tiny_model_dir, tmp_path: Path, capsys) -> None:
    model = tiny_model_dir("llama")
    delta = _finetune(model, tmp_path)
    tasks = write_choice_task(tmp_path / "tasks", choice_rows(4))
    ev = tmp_path / "ev"
    args = ["evaluate", "--model", str(model), "--delta", str(delta), "--harness-tasks", CHOICE_TASK,
            "--harness-include-path", str(tasks), "--out", str(ev), "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert f"harness:{CHOICE_TASK} acc,none" in capsys.readouterr().out
    (row,) = csv.DictReader((ev / "results.csv").open())  # harness tasks alone: no built-in benchmark ran
    assert (row["benchmark"], row["kind"], row["n"], row["metric"]) == (f"harness:{CHOICE_TASK}", "harness", "4",
                                                                        "acc,none")  # fmt: skip
    assert float(row["accuracy"]) == float(row["score"]) == int(row["correct"]) / 4
    meta = json.loads((ev / "metadata.json").read_text())
    assert meta["config"]["benchmarks"] == [] and meta["versions"]["lm_eval"]
    assert meta["harness"][CHOICE_TASK]["scores"][0]["value"] == float(row["score"])
    assert (ev / meta["harness"][CHOICE_TASK]["results"]).is_file()

    handle = load_model(ModelConfig(model=str(model)))
    base = copy.deepcopy(handle.model)
    tuned = apply_delta(handle.model, delta)
    moved = 0.0
    for line in (ev / meta["harness"][CHOICE_TASK]["samples"][CHOICE_TASK]).read_text().splitlines():
        sample = json.loads(line)
        pairs = zip(sample["arguments"], sample["filtered_resps"], strict=True)
        for (context, continuation), (reported, _greedy) in pairs:
            assert reported == pytest.approx(direct_loglikelihood(tuned, handle.tokenizer, context, continuation),
                                             abs=1e-4)  # fmt: skip
            moved = max(moved, abs(reported - direct_loglikelihood(base, handle.tokenizer, context, continuation)))
    assert moved > 1e-3, "the harness must score the tuned model, not the base model"


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
