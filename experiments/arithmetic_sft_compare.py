"""The comparisons table.md prints: paired per-prompt differences on the test part, clustered by template and fact.

Every row is tested on the same prompts (one split, one seed), so a comparison of two rows is the mean of the
per-prompt differences d_i = mean over seeds of y_i(side A) - mean over seeds of y_i(side B), y_i = 1 when the
first answer token is right. Its 95% interval (arithmech.evaluate.clustered_interval, formulas there) adds three
independent variance parts, each on its own degrees of freedom:

    V_clusters   two-way clustered variance of mean(d) by template and fact     df = min(templates, facts) - 1
    s_A^2 / S_A  side A's seed-to-seed variance of its accuracy, over S_A seeds   df = S_A - 1
    s_B^2 / S_B  the same for side B                                             df = S_B - 1

    mean(d) +- t_{0.975, df} sqrt(V_clusters + s_A^2 / S_A + s_B^2 / S_B),  df by Welch-Satterthwaite

(a side with one seed adds nothing). The seed variance is what the prompts do not show: another seed, or another
random draw of heads, gives another model. It also holds part of the prompt-level noise, which V_clusters holds
already, so the interval is if anything conservative.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from arithmech.data.facts import fact_of
from arithmech.evaluate.clustered_interval import Difference, clustered_difference

RECORDS = Path("eval-test") / "examples" / "arithmetic.jsonl"
"""Per-prompt records of the test part, as the evaluate stage writes them."""

Prompt = tuple[str, int, int]


def outcomes(folder: Path, operation: str) -> dict[Prompt, bool]:
    """(template, A, B) -> first answer token right, for the test prompts of `operation` a row was scored on."""
    lines = (folder / RECORDS).read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line]
    return {(r["template_id"], int(r["a"]), int(r["b"])): bool(r["correct"]) for r in rows
            if r["operation"] == operation}  # fmt: skip


def paired_difference(side_a: list[Path], side_b: list[Path], operation: str) -> Difference:
    """Side A's accuracy minus side B's on `operation`, each the mean over its seeds' folders, with its interval and
    degrees of freedom (module docstring)."""
    runs_a, runs_b = [outcomes(f, operation) for f in side_a], [outcomes(f, operation) for f in side_b]
    keys = sorted(runs_a[0])
    if not keys or any(sorted(run) != keys for run in [*runs_a, *runs_b]):
        raise ValueError(f"the rows compared were not scored on the same {operation} test prompts; rerun their "
                         "test evaluations with one split seed and one --eval-limit")  # fmt: skip
    differences = [statistics.fmean(run[k] for run in runs_a) - statistics.fmean(run[k] for run in runs_b)
                   for k in keys]  # fmt: skip
    seeds = [(statistics.variance([statistics.fmean(run.values()) for run in runs]) / len(runs), len(runs) - 1.0)
             for runs in (runs_a, runs_b) if len(runs) > 1]  # fmt: skip
    facts = [fact_of(operation, a, b) for _, a, b in keys]
    return clustered_difference(differences, [k[0] for k in keys], facts, seeds)


def points(diff: Difference) -> str:
    """A difference in percentage points with its interval, e.g. "+12.5 points [+3.1, +21.9]"."""
    return f"{diff.mean * 100:+.1f} points [{diff.low * 100:+.1f}, {diff.high * 100:+.1f}]"


def degrees(diff: Difference, seeds: tuple[int, ...] = ()) -> str:
    """Where the interval's t quantile comes from, e.g. "t on 6.3 df, Welch-Satterthwaite of min(5 templates, 22
    facts) - 1 = 4 and seeds 5 - 1, 5 - 1"."""
    clusters = f"min({diff.templates} templates, {diff.facts} facts) - 1 = {diff.cluster_df:g}"
    seeded = [f"{s} - 1" for s in seeds if s > 1]
    if not seeded:
        return f"t on {diff.df:g} df: {clusters}"
    return f"t on {diff.df:.1f} df, Welch-Satterthwaite of {clusters} and seeds {', '.join(seeded)}"
