"""The comparisons table.md prints: paired per-prompt differences on the test part, clustered by template and fact.

Every row is tested on the same prompts (one split, one seed), so a comparison of two rows is the mean of the
per-prompt differences d_i = mean over seeds of y_i(side A) - mean over seeds of y_i(side B), y_i = 1 when the
first answer token is right. Its 95% interval is two-way clustered by template and fact
(arithmech.evaluate.clustered_interval), plus the seed-to-seed variance of each side's accuracy over its seeds
(sample variance / number of seeds; 0 with one seed), which the prompts do not show. That adds part of the
prompt-level noise a second time, so the interval is if anything conservative.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from arithmech.data.facts import fact_of
from arithmech.evaluate.clustered_interval import clustered_difference

RECORDS = Path("eval-test") / "examples" / "arithmetic.jsonl"
"""Per-prompt records of the test part, as the evaluate stage writes them."""

Prompt = tuple[str, int, int]


def outcomes(folder: Path, operation: str) -> dict[Prompt, bool]:
    """(template, A, B) -> first answer token right, for the test prompts of `operation` a row was scored on."""
    lines = (folder / RECORDS).read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line]
    return {(r["template_id"], int(r["a"]), int(r["b"])): bool(r["correct"]) for r in rows
            if r["operation"] == operation}  # fmt: skip


def paired_difference(side_a: list[Path], side_b: list[Path], operation: str) -> tuple[float, float, float]:
    """(mean, low, high) of side A's accuracy minus side B's on `operation`, each the mean over its seeds' folders."""
    runs_a, runs_b = [outcomes(f, operation) for f in side_a], [outcomes(f, operation) for f in side_b]
    keys = sorted(runs_a[0])
    if not keys or any(sorted(run) != keys for run in [*runs_a, *runs_b]):
        raise ValueError(f"the rows compared were not scored on the same {operation} test prompts; rerun their "
                         "test evaluations with one split seed and one --eval-limit")  # fmt: skip
    differences = [statistics.fmean(run[k] for run in runs_a) - statistics.fmean(run[k] for run in runs_b)
                   for k in keys]  # fmt: skip
    seed_variance = sum(statistics.variance([statistics.fmean(run.values()) for run in runs]) / len(runs)
                        for runs in (runs_a, runs_b) if len(runs) > 1)  # fmt: skip
    facts = [fact_of(operation, a, b) for _, a, b in keys]
    return clustered_difference(differences, [k[0] for k in keys], facts, seed_variance)


def points(mean: float, low: float, high: float) -> str:
    """A difference in percentage points with its interval, e.g. "+12.5 points [+3.1, +21.9]"."""
    return f"{mean * 100:+.1f} points [{low * 100:+.1f}, {high * 100:+.1f}]"
