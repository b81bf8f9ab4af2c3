"""The scale guide's tables (benchmarks/scale_tables.py): the plan at the paper's sizes as `plan_stage` computes it,
and the skeletons' measurements as benchmarks/results.json holds them, "not measured yet" without them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH_DIR) not in sys.path:  # the benchmark scripts are not a package; they import each other by name
    sys.path.insert(0, str(BENCH_DIR))

import scale_tables  # noqa: E402
from skeleton_stages import run_by_key  # noqa: E402

from arithmech.plan.devices import PROFILES  # noqa: E402

STAMP = {"command": "python benchmarks/plan_skeletons.py --resume x", "date": "2026-01-01", "git_sha": "abcdef0123",
         "machine": {"cpu": "cpu", "logical_cores": 2, "torch": "2.13", "device": "cpu"}}  # fmt: skip


def _row(preset: str, layers: int, stage: str, planned: int, measured: int, status: str = "measured") -> dict[str, Any]:
    return {"preset": preset, "layers": layers, "dtype": "bfloat16", "stage": stage, "status": status,
            "planned_bytes": planned, "measured_bytes": measured, "note": ""}  # fmt: skip


def test_the_guide_carries_what_the_plan_and_results_json_render() -> None:
    assert scale_tables.main(["--check"]) == 0, (
        "run `python benchmarks/scale_tables.py --write` and commit docs/guides/scale.md"
    )


def test_a_run_one_device_holds_shows_its_time_and_one_it_cannot_the_fewest_gpus() -> None:
    identify = scale_tables.placement("llama2-7b", run_by_key("identify-path"), "h100")
    assert identify.startswith("~") and "GPU" not in identify
    full = scale_tables.placement("llama3.1-8b", run_by_key("finetune-full"), "h100")
    plan = scale_tables._plan("llama3.1-8b", "finetune-full", 2)
    assert full.startswith("FSDP2 on 2, ~") and plan.memory["fsdp2"].peak <= (PROFILES["h100"].memory or 0)
    assert scale_tables._plan("llama3.1-8b", "finetune-full", 1).memory["single"].peak > (PROFILES["h100"].memory or 0)


def test_a_run_that_fits_one_device_at_smaller_sizes_is_placed_there_and_names_them() -> None:
    """As a stage sizes itself under --max-memory: precise SFT's micro-batches shrink to fit an A100 40 GB."""
    run = run_by_key("finetune-precise")
    assert scale_tables._plan("llama2-7b", run.key, 1).memory["single"].peak > (PROFILES["a100-40"].memory or 0)
    cell = scale_tables.placement("llama2-7b", run, "a100-40")
    assert cell.startswith("~") and "GPU" not in cell and "FSDP2" not in cell
    assert cell.endswith("at micro batch size 4"), cell


def test_measured_tables_show_ratios_bold_outside_the_tolerance_and_growth() -> None:
    rows = [_row("mistral-7b", 2, "knockout", 105, 100), _row("mistral-7b", 4, "knockout", 205, 150),
            _row("mistral-7b", 2, "finetune-full", 0, 0, "skipped")]  # fmt: skip
    growth = [{"preset": "mistral-7b", "dtype": "bfloat16", "stage": "knockout", "layers": [2, 4],
               "planned_per_layer": 50.0, "measured_per_layer": 25.0}]  # fmt: skip
    metrics = {"rows": rows, "growth": growth, "runs_measured": 2, "runs_within_tolerance": 1, "runs_skipped": 1,
               "runs_failed": 0, "memory_measured_as": "CPU allocator's peak"}  # fmt: skip
    lines = scale_tables.skeleton_tables({**STAMP, "metrics": metrics})
    assert "| skeleton | knockout | finetune-full |" in lines
    assert "| mistral-7b x 2, bfloat16 | 1.05 (105 B / 100 B) | skipped |" in lines
    assert "| mistral-7b x 4, bfloat16 | **1.37** (205 B / 150 B) | - |" in lines
    assert "| mistral-7b, bfloat16 | 2.00 (50 B / 25 B) | - |" in lines
    assert "1 of 2 runs within 15%" in lines[0] and "measured 2026-01-01" in lines[0]
    # at Mistral's 32 layers: (205 + 28 x 50) / (150 + 28 x 25) planned over measured, an over-plan
    assert "from 1.89 (mistral-7b bfloat16 knockout) to 1.89" in lines[-1] and "none below 0.85" in lines[-1]
    short = {**metrics, "growth": [{**growth[0], "planned_per_layer": 10.0}]}  # (205 + 280) / (150 + 700)
    assert "below 0.85: mistral-7b bfloat16 knockout (0.57)." in scale_tables.skeleton_tables(
        {**STAMP, "metrics": short})[-1]  # fmt: skip


def test_without_results_both_measured_tables_say_not_measured_yet() -> None:
    section = scale_tables.measured_section({"full": {}, "quick": {}})
    assert section.count("not measured yet") == 2
    assert section.startswith(scale_tables.MEASURED_BEGIN) and section.endswith(scale_tables.MEASURED_END)


def test_numerics_rows_are_rendered_one_per_dtype_and_method() -> None:
    row = {"preset": "gemma2-9b", "layers": 2, "dtype": "float16", "method": "eap-ig", "max_rel_diff": 0.0123,
           "spearman": 0.99991, "top_agreement": 1.0, "nonfinite": 0, "float16_headroom": 5120.0}  # fmt: skip
    lines = scale_tables.numerics_table({**STAMP, "metrics": {"rows": [row]}})
    assert lines[-1] == "| gemma2-9b x 2 | float16 | eap-ig | 1.2e-02 | 0.9999 | 1.00 | 0 | 5,120x |"
