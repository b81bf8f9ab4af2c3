"""benchmarks/numbers_sweep.py at a tiny size: the stage's family x layer sweep counted against one forward pass per
variant, and its cells checked against plain forward hooks, on a tiny model with single-token numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH_DIR) not in sys.path:  # the benchmark scripts are not a package; they import each other by name
    sys.path.insert(0, str(BENCH_DIR))

import numbers_sweep  # noqa: E402

from tiny_models import save_multidigit_model_dir  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _no_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARITHMECH_BENCH_RECORD", raising=False)


def test_the_sweep_costs_a_few_passes_and_agrees_with_plain_hooks(tmp_path: Path, capsys) -> None:
    model = save_multidigit_model_dir("llama", tmp_path / "model")
    metrics = numbers_sweep.main(["--model", str(model), "--high", "40", "--few-shot", "1", "--no-filter-correct",
                          "--max-prompts", "6", "--max-pairs", "120", "--layers", "0,1", "--sites", "a",
                          "--families", "helix,pca", "--shuffles", "1", "--check-cells", "2"])  # fmt: skip
    assert metrics["max_abs_diff"] <= 1e-4, metrics  # float32: the readout rounds alike, the rest in float32
    # the rows join at their layer on the positions from the site on (here 8 of 18 positions, layers 0 and 1 of
    # 3): under half a pass per variant, with the two base runs per pair
    assert metrics["sweep_passes"] < metrics["naive_passes"] / 2 and metrics["work_ratio"] > 2, metrics
    assert metrics["pairs"] == 12 and metrics["variants"] > metrics["pairs"], metrics  # sites a and its control
    out = capsys.readouterr().out
    assert "family x layer sweep" in out and "max |stage - plain hooks|" in out
