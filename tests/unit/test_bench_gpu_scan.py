"""benchmarks/gpu_scan.py checks its scan against the per-component loop, as the CPU benchmarks do: run here on a
CPU at a tiny shape in float32, where the two must agree to float rounding; a wrong engine is caught. It prints the
plan of the same scan beside what it measured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH_DIR) not in sys.path:  # the benchmark scripts are not a package; they import each other by name
    sys.path.insert(0, str(BENCH_DIR))

import gpu_scan  # noqa: E402

TINY = ["--device", "cpu", "--dtype", "float32", "--prompts", "6", "--tokens", "10", "--batch-size", "4",
        "--layers", "2", "--hidden", "32", "--heads", "4", "--intermediate", "64", "--vocab", "300"]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARITHMECH_BENCH_RECORD", raising=False)


def test_the_scan_agrees_with_the_loop_on_a_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = gpu_scan.main(TINY)
    assert metrics["max_abs_diff"] <= 1e-5
    assert metrics["max_abs_effect"] > 1e-3  # the effects compared are not all ~0: the check has power
    out = capsys.readouterr().out
    assert "max |fast - loop| on 6 components x 4 prompts" in out
    # the plan of the same scan beside the measurement (issue 33): memory planned, time estimated, never swapped
    assert "plan of this scan: memory above the weights: planned " in out and ", measured " in out
    assert "time: estimated ~" in out and "(this machine (measured profile)), measured " in out
    assert metrics["planned_gib"] > 0 and metrics["measured_gib"] > 0 and metrics["estimated_s"] > 0


def test_a_wrong_engine_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gpu_scan.path_patch

    def off_by_a_bit(*args, **kwargs):
        result = real(*args, **kwargs)
        result.per_prompt[0] += 0.01  # head 0.0, one of the components checked
        return result

    monkeypatch.setattr(gpu_scan, "path_patch", off_by_a_bit)
    assert gpu_scan.main(TINY)["max_abs_diff"] == pytest.approx(0.01, rel=1e-3)


def test_agreement_reads_the_checked_components_and_prompts() -> None:
    from arithmech.models.sites import Component
    from arithmech.patching.path import PatchResult

    components = [Component(0, 0), Component(0, 1), Component(0)]
    per_prompt = torch.tensor([[0.1, 0.2, 9.0], [0.3, 0.4, 9.0], [0.5, 0.6, 9.0]])  # [component, prompt]
    result = PatchResult(components, per_prompt, torch.ones(3), torch.ones(3), "path")
    loop = {Component(0): torch.tensor([0.5, 0.7]), Component(0, 0): torch.tensor([0.1, 0.2])}
    diff, scale = gpu_scan.agreement(result, loop, slice(0, 2))
    assert diff == pytest.approx(0.1) and scale == pytest.approx(0.7)
