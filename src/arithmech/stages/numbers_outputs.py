"""The numbers stage's files: numbers_ld.csv, numbers_periods.json, the Clock's numbers_clock.csv and
numbers_clock_heads.csv, the two figures, then metadata.json (with the verdict sentences of `numbers_verdict.py`),
each written atomically."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from arithmech.runs import atomic_write_json, atomic_write_text, csv_text
from arithmech.stages.numbers_table import COLUMNS
from arithmech.stages.numbers_verdict import sort_key, verdict_sentence

if TYPE_CHECKING:
    from arithmech.data.number_grid import NumberGrid
    from arithmech.stages.numbers import NumbersResult


def write_numbers_outputs(result: NumbersResult, model_name: str, grid: NumberGrid) -> None:
    """Every table and figure, then metadata.json."""
    from arithmech.report.numbers_plots import helix_projection, ld_by_family

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    atomic_write_text(out / "numbers_ld.csv", csv_text(result.rows, COLUMNS, float_format=".5g"))
    atomic_write_json(out / "numbers_periods.json", {"sites": result.periods, "verdicts": result.verdicts})
    if result.clock is not None:
        atomic_write_text(out / "numbers_clock.csv", csv_text(result.clock.rows, float_format=".5g"))
        if result.clock.heads:
            atomic_write_text(out / "numbers_clock_heads.csv", csv_text(result.clock.heads, float_format=".5g"))
    if result.rows:  # else only the clock site was read
        ld_by_family(result.rows, out / "numbers_ld.png", f"LD restored per layer by reading: {model_name}")
    best = _best_helix(result)
    if best is not None:
        site, layer, name = best
        li = result.layers.index(layer)
        values = torch.arange(grid.low, grid.high)
        panels = []
        for shuffled in (False, True):
            fit = result.fits[(site, layer, name, int(shuffled))]
            label = f"{name}{' (shuffled a)' if shuffled else ''}"
            panels.append((label, _circle_coords(fit, result.means[site][:, li], values)))
        helix_projection(
            panels,
            out / "numbers_helix.png",
            f"operand means at {site}, layer {layer}, on the first circle of {name}: {model_name}",
        )
    result.metadata["verdicts"] = [verdict_sentence(v) for v in result.verdicts]
    atomic_write_json(out / "metadata.json", result.metadata)


def _best_helix(result: NumbersResult) -> tuple[str, int, str] | None:
    """(site, layer, helix) with the largest restored share outside the control site."""
    rows = [r for r in result.rows if r["kind"] == "helix" and not r["control"] and r["restored"] is not None]
    if not rows:
        return None
    best = max(rows, key=lambda r: sort_key(r["restored"]))
    return best["site"], best["layer"], best["family"]


def _circle_coords(fit: Any, means: torch.Tensor, values: torch.Tensor) -> list[tuple[int, float, float]]:
    """(value, x, y): each seen value's mean activation (less the fit's mean) read by least squares on the two
    directions the fit's first circle writes (its cos and sin columns of W)."""
    seen = ~torch.isnan(means[:, 0])
    x = means[seen] - fit.mean  # [seen, d_model]
    periods = list(fit.family.periods)
    wide = [t for t in periods if t > 2]  # circles with a sin column (period 2 has cos only)
    start = (1 if fit.family.kind == "helix" else 0) + (periods.index(wide[0]) if wide else 0)  # past period 2's cos
    width = 2 if wide else 1
    circle = fit.w[:, start : start + width]  # [d_model, 1 or 2]
    coords = torch.linalg.lstsq(circle, x.T).solution.T  # [seen, 1 or 2]
    return [(int(v), float(c[0]), float(c[1]) if width == 2 else 0.0)
            for v, c in zip(values[seen].tolist(), coords, strict=True)]  # fmt: skip
