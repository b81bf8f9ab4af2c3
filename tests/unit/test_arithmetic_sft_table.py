"""experiments/arithmetic_sft_table.py on hand-written run folders: the table, the positive-control verdict, the
effect-ranked vs random comparison over seeds, LoRA's matched rank and the sweep score."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
if str(EXPERIMENTS) not in sys.path:  # the experiment scripts are not a package
    sys.path.insert(0, str(EXPERIMENTS))

import arithmetic_sft_table as table  # noqa: E402

from arithmech.evaluate.arithmetic import GROUP_COLUMNS, wilson_interval  # noqa: E402

ARGS = Namespace(ops=("subtraction",), ks=[8])
SMOLLM2 = {"d_model": 576, "n_heads": 9, "n_kv_heads": 3, "d_head": 64, "n_layers": 30}


def write_row(folder: Path, correct: int, lr: float | None, kl: float = 0.001) -> Path:
    """A finished row: training metadata (unless base), test arithmetic.csv (120 subtraction prompts), general."""
    n = 120
    rows = []
    for bench, op in (("arithmetic", "all"), ("arithmetic", "subtraction"),
                      ("arithmetic-multidigit-subtraction", "subtraction")):  # fmt: skip
        (lo, hi) = wilson_interval(correct, n)
        rows.append([bench, op, "all", n, correct, correct / n, lo, hi, correct // 2, correct / 2 / n, lo / 2, hi / 2])
    (folder / "eval-test").mkdir(parents=True)
    (folder / "eval-test" / "arithmetic.csv").write_text(
        ",".join(GROUP_COLUMNS) + "\n" + "".join(",".join(str(c) for c in r) + "\n" for r in rows))
    general = {"mmlu": {"correct": 5, "n": 20}, "csqa": {"correct": 4, "n": 20},
               "general": {"info": {"perplexity": 37.5, "kl": kl if lr else None}}}  # fmt: skip
    (folder / "eval-general").mkdir()
    (folder / "eval-general" / "metadata.json").write_text(json.dumps({"benchmarks": general}))
    if lr is not None:
        meta = {"config": {"lr": lr}, "trainable_parameters": 1_105_920, "samples_per_second": 3.2,
                "peak_memory": {"bytes": 2 * 2**30}, "selection": {"heads": ["14.2", "13.6"]}}  # fmt: skip
        (folder / "metadata.json").write_text(json.dumps(meta))
    return folder


def run(tmp_path: Path, full_correct: int) -> str:
    rows = {"base": None}
    write_row(tmp_path / "base", 30, None)
    for name, correct, lr in (("precise-top8", 60, 1e-3), ("precise-random8-seed0", 36, 3e-4),
                              ("precise-random8-seed1", 40, 3e-4), ("precise-random8-seed2", 44, 3e-4),
                              ("full", full_correct, 1e-4), ("lora", 50, 1e-3)):  # fmt: skip
        rows[name] = write_row(tmp_path / name, correct, lr)
    table.write_outputs(tmp_path, rows, ARGS)
    return (tmp_path / "table.md").read_text()


def test_table_verdicts_and_random_summary(tmp_path: Path) -> None:
    text = run(tmp_path / "a", full_correct=77)
    lo, hi = wilson_interval(60, 120)
    assert "| precise-top8 | 0.001 | 1,105,920 | 3.20 | 2,048 | " in text
    assert f"50.0% [{lo:.0%}, {hi:.0%}]" in text  # top-8's held-out subtraction with its Wilson interval
    assert "- positive control, subtraction: base 25.0% [18%, 33%] -> full SFT 64.2% [55%, 72%]: beyond the 95% " \
        "intervals" in text  # fmt: skip
    assert "- k = 8, subtraction: effect-ranked 50.0% [41%, 59%] vs random 33.3% ± 3.3% (sd over 3 seeds: 30.0%, " \
        "33.3%, 36.7%)" in text  # fmt: skip
    assert "| base | - | - | - | - |" in text and text.count("| 5/20 | 4/20 | 37.50 |") == 7
    assert (tmp_path / "a" / "arithmetic_sft.png").is_file() and (tmp_path / "a" / "table.csv").is_file()
    weak = run(tmp_path / "b", full_correct=38)  # 31.7%: its interval overlaps base's
    assert "full SFT 31.7% [24%, 40%]: NOT beyond them: the setup is too small, raise --steps" in weak


def test_lora_rank_matches_the_precise_parameter_count(tmp_path: Path) -> None:
    assert table.lora_params_per_rank(SMOLLM2) == 115_200  # r * (576 + 576 + 2 * (576 + 192) + 576 + 576) * 30
    (tmp_path / "identify").mkdir()
    (tmp_path / "identify" / "metadata.json").write_text(json.dumps({"dims": SMOLLM2}))
    (tmp_path / "precise").mkdir()
    (tmp_path / "precise" / "metadata.json").write_text(json.dumps({"trainable_parameters": 3_981_312}))
    assert table.lora_rank(tmp_path / "precise", tmp_path / "identify") == 35  # 4,032,000 vs 3,981,312


def test_sweep_score_is_the_mean_over_training_operations(tmp_path: Path) -> None:
    folder = tmp_path / "eval-validation"
    folder.mkdir()
    rows = ["arithmetic-subtraction,subtraction,all,66,33,0.5,0.38,0.62,33,0.5,0.38,0.62",
            "arithmetic-division,division,all,42,21,0.25,0.14,0.4,21,0.25,0.14,0.4"]  # fmt: skip
    (folder / "arithmetic.csv").write_text(",".join(GROUP_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    assert table.sweep_score(folder, ("subtraction", "division")) == pytest.approx(0.375)
