"""benchmarks/gpu_finetune.py at a tiny shape on a CPU: each method trains in its own process, and each prints the plan
of the same training beside what it measured (issue 33: memory planned, time estimated, never called measured)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH_DIR) not in sys.path:  # the benchmark scripts are not a package; they import each other by name
    sys.path.insert(0, str(BENCH_DIR))

import gpu_finetune  # noqa: E402

TINY = ["--device", "cpu", "--layers", "2", "--hidden", "256", "--vocab", "512", "--steps", "1", "--batch-size", "2",
        "--micro-batch-size", "2", "--tokens", "16", "--heads", "2"]  # fmt: skip


def test_each_method_prints_its_plan_beside_the_measurement(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ARITHMECH_BENCH_RECORD", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    metrics = gpu_finetune.main(TINY)
    lines = capsys.readouterr().out.splitlines()
    plans = [line for line in lines if "plan of this training: memory above the weights: planned " in line]
    assert len(plans) == 2 and all("time: estimated ~" in p and "(time per step)" in p for p in plans)
    for method in ("precise", "full"):
        assert metrics[f"{method}_planned_gib"] > 0 and metrics[f"{method}_measured_gib"] > 0
        assert metrics[f"{method}_estimated_s_per_step"] > 0
    assert metrics["full_planned_gib"] > metrics["precise_planned_gib"]  # gradients and moments of every weight
