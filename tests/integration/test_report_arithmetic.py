"""The report's Fine-tuning and Evaluation sections for an arithmetic fine-tune: base vs tuned per operation, next
to the general-ability change, from a real tiny-model run folder and from known numbers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from arithmech.cli import main
from arithmech.report.html import write_report


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """identify -> precise SFT on subtraction prompts of the split -> evaluate base and tuned, on the tiny Llama."""
    root = tmp_path_factory.mktemp("arith-report")
    config = {
        "out": str(root / "run"), "model": {"model": str(tiny_model_dir("llama"))},
        "stages": ["identify", "finetune", "evaluate"],
        "identify": {"filter_correct": False, "formations": ["equation"], "n_per_template": 2},
        "finetune": {"top_k": 2, "data": "arithmetic", "operations": ["subtraction"], "max_samples": 8,
                     "batch_size": 4, "micro_batch_size": 4, "max_steps": 2, "lr": 0.01},
        "evaluate": {"benchmarks": ["arithmetic-subtraction", "arithmetic-multidigit-addition", "general"],
                     "n_shot": 1, "limit": 12, "general_max_tokens": 32},
    }  # fmt: skip
    (root / "run.yaml").write_text(yaml.safe_dump(config))
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["run", "--config", str(root / "run.yaml"), "--quiet"]) == 0
    finally:
        torch.set_num_threads(threads)
    return root / "run"


def _rows(folder: Path) -> dict[tuple[str, str], dict[str, str]]:
    rows = csv.DictReader((folder / "arithmetic.csv").open())
    return {(r["benchmark"], r["operation"]): r for r in rows if r["formation"] == "all"}


def test_sections_quote_base_and_tuned_per_operation_and_the_general_change(run_dir: Path) -> None:
    text = write_report(run_dir).read_text()
    ev = run_dir / "evaluate"
    base, tuned = _rows(ev / "base"), _rows(ev / "tuned")
    b, t = base["arithmetic-subtraction", "subtraction"], tuned["arithmetic-subtraction", "subtraction"]
    change = (float(t["accuracy"]) - float(b["accuracy"])) * 100
    assert (f"subtraction {float(b['accuracy']) * 100:.1f}% -&gt; {float(t['accuracy']) * 100:.1f}% "
            f"({change:+.1f} points, ") in text  # fmt: skip
    assert "multi-digit addition (10-99) exact" in text
    general = {r["benchmark"]: r for r in csv.DictReader((ev / "tuned" / "results.csv").open())}["general"]
    assert f"(KL to the base model {float(general['kl']):.3g}" in text  # the general-ability change beside it
    assert "Arithmetic per operation on held-out templates and operand pairs" in text
    assert f"{float(b['ci_low']) * 100:.1f}%-{float(b['ci_high']) * 100:.1f}%" in text  # the Wilson interval
    split = json.loads((run_dir / "finetune" / "split.json").read_text())["fingerprint"]
    assert f"The tuned model was trained on the train part of this split ({split})." in text
    meta = json.loads((run_dir / "finetune" / "metadata.json").read_text())
    assert f"on {meta['data']['kept']} arithmetic prompts (subtraction; train templates" in text


def test_reading_from_known_numbers_and_a_split_mismatch(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ev = run / "evaluate"
    head = "benchmark,operation,formation,n,correct,accuracy,ci_low,ci_high,exact,exact_accuracy,exact_ci_low," \
        "exact_ci_high\n"  # fmt: skip
    results = "benchmark,kind,n,correct,accuracy,accuracy_norm,perplexity,base_perplexity,kl,excluded,seconds\n"
    files = {
        ev / "base" / "arithmetic.csv": head + "arithmetic,all,all,220,80,0.36,0.30,0.43,80,0.36,0.30,0.43\n"
        "arithmetic,subtraction,all,120,30,0.25,0.18,0.33,30,0.25,0.18,0.33\n"
        "arithmetic,addition,all,100,50,0.50,0.40,0.60,50,0.50,0.40,0.60\n",
        ev / "tuned" / "arithmetic.csv": head + "arithmetic,all,all,220,128,0.58,0.52,0.65,128,0.58,0.52,0.65\n"
        "arithmetic,subtraction,all,120,72,0.60,0.51,0.68,72,0.60,0.51,0.68\n"
        "arithmetic,addition,all,100,56,0.56,0.46,0.65,56,0.56,0.46,0.65\n",
        ev / "base" / "results.csv": results + "arithmetic,arithmetic,220,80,0.36,,,,,0,1\n"
        "general,general,10,,,,36.9,,,0,1\n",
        ev / "tuned" / "results.csv": results + "arithmetic,arithmetic,220,128,0.58,,,,,0,1\n"
        "general,general,10,,,,37.2,36.9,0.0031,0,1\n",
        ev / "tuned" / "split.json": json.dumps({"fingerprint": "aaaa"}),
        run / "finetune" / "split.json": json.dumps({"fingerprint": "bbbb"}),
        **{folder / "metadata.json": "{}" for folder in (ev, ev / "base", ev / "tuned")},
    }  # fmt: skip
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    text = write_report(run).read_text()
    assert ("Held-out arithmetic, base -&gt; tuned (unseen templates and operand pairs; first answer token, exact "
            "number for multi-digit): subtraction 25.0% -&gt; 60.0% (+35.0 points, beyond the 95% intervals); "
            "addition 50.0% -&gt; 56.0% (+6.0 points, within the 95% intervals). General ability, base -&gt; tuned: "
            "perplexity on general text 36.9 -&gt; 37.2 (KL to the base model 0.0031). WARNING: the tuned model was "
            "trained on another split (bbbb) than the one tested (aaaa)") in text  # fmt: skip
    assert "arithmetic (n=220)" not in text  # the per-operation reading replaces the benchmark's one-line reading
