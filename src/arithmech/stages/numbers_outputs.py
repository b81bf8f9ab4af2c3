"""The analyze-numbers stage's summaries and files: the chosen periods, the verdict per site, and the writer.

Verdict (`verdicts`), per site (the control site apart)
    Among the layers whose whole-layer effect is estimable (numbers_ld.csv's estimable), the one where the
    whole-layer patch restores the most LD; there, the families ranked by LD on the train
    values (the whole layer left out). The winner is the first; its margin is its LD less the runner-up's, and
    its order margin its LD less its own shuffled control's. A reading "wins" only where it beats its shuffled
    control by more than `ORDER_MARGIN` of the whole layer's restored LD: else the site shows no ordered
    structure the patch can use.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from arithmech.runs import atomic_write_json, atomic_write_text, csv_text

if TYPE_CHECKING:
    from arithmech.data.number_grid import NumberGrid
    from arithmech.stages.numbers import NumbersResult

ORDER_MARGIN = 0.1
"""A family's restored share must beat its shuffled control's by this much to count as ordered structure."""
PARSIMONY = 0.05
"""The chosen helix restores at least the best helix's share less this (`chosen_helix`)."""


def _num(value: Any) -> float:
    return float(value) if value is not None and not (isinstance(value, float) and math.isnan(value)) else -math.inf


def best_periods(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """numbers_periods.json: per site and layer the chosen helix (`chosen_helix`); per site the layer where the
    chosen helix restores the largest share."""
    out: dict[str, Any] = {}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        if row["kind"] == "helix" and row["restored"] is not None:
            groups.setdefault((row["site"], row["layer"]), []).append(row)
    for (site, layer), helices in groups.items():
        pick = chosen_helix(helices)
        entry = out.setdefault(site, {"per_layer": {}, "best": None})
        entry["per_layer"][str(layer)] = {
            "family": pick["family"], "periods": [int(t) for t in str(pick["periods"]).split("-") if t],
            **{k: pick[k] for k in ("ld", "ld_shuffled", "ld_layer", "restored", "restored_shuffled", "ld_heldout")},
            "best_family": max(helices, key=lambda r: _num(r["restored"]))["family"],
        }  # fmt: skip
    for entry in out.values():
        layer, best = max(entry["per_layer"].items(), key=lambda kv: _num(kv[1]["restored"]))
        entry["best"] = {"layer": int(layer), **best}
    return out


def chosen_helix(helices: list[dict[str, Any]]) -> dict[str, Any]:
    """The helix with the fewest periods whose restored share is within `PARSIMONY` of the best helix's (a
    superset of the right periods restores as much, with dimensions to spare); ties by restored share."""
    top = max(_num(r["restored"]) for r in helices)
    near = [r for r in helices if _num(r["restored"]) >= top - PARSIMONY]
    return min(near, key=lambda r: (len(str(r["periods"]).split("-")), -_num(r["restored"])))


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The verdict of the module docstring, one dict per site."""
    out = []
    sites = list(dict.fromkeys(r["site"] for r in rows))
    for site in sites:
        mine = [r for r in rows if r["site"] == site]
        whole = [r for r in mine if r["kind"] == "layer" and r.get("estimable", 1)]  # not estimable: no verdict
        if not whole:
            continue
        top = max(whole, key=lambda r: _num(r["ld"]))
        layer = top["layer"]
        ranked = sorted((r for r in mine if r["layer"] == layer and r["kind"] != "layer"), key=lambda r: -_num(r["ld"]))
        if not ranked:
            continue
        win = ranked[0]
        second = ranked[1] if len(ranked) > 1 else None
        order = _num(win["restored"]) - _num(win["restored_shuffled"])
        out.append({
            "site": site, "control": bool(top["control"]), "layer": layer, "ld_layer": top["ld"],
            "ld_clean": top["ld_clean"], "ld_corrupted": top["ld_corrupted"], "winner": win["family"],
            "ld": win["ld"], "restored": win["restored"], "ld_shuffled": win["ld_shuffled"],
            "restored_shuffled": win["restored_shuffled"], "runner_up": second["family"] if second else None,
            "ld_runner_up": second["ld"] if second else None, "ld_heldout": win.get("ld_heldout"),
            "ablation_lost": win.get("ablation_lost"), "random_lost": win.get("random_lost"),
            "ordered": bool(order > ORDER_MARGIN), "order_margin": order if math.isfinite(order) else None,
        })  # fmt: skip
    return out


def verdict_sentence(v: dict[str, Any]) -> str:
    """One sentence in words: which reading wins at a site, by how much, against its controls."""

    def f(x: Any) -> str:
        return "n/a" if x is None else f"{float(x):.2f}"

    def pct(x: Any) -> str:
        return "n/a" if x is None else f"{float(x):.0%}"

    head = (f"{v['site']}: at layer {v['layer']} (whole layer LD {f(v['ld_layer'])}, corrupted "
            f"{f(v['ld_corrupted'])}) {v['winner']} restores the most, LD {f(v['ld'])} "
            f"({pct(v['restored'])} of the whole layer's)")  # fmt: skip
    if v["runner_up"] is not None:
        head += f", ahead of {v['runner_up']} ({f(v['ld_runner_up'])})"
    controls = (f"; shuffled control {f(v['ld_shuffled'])} ({pct(v['restored_shuffled'])}), held-out values "
                f"{f(v['ld_heldout'])}, ablating its subspace loses {pct(v['ablation_lost'])} of the LD vs "
                f"{pct(v['random_lost'])} for a random one")  # fmt: skip
    tail = "" if v["ordered"] else "; it does not beat its shuffled control, so no ordered reading wins here"
    return head + controls + tail + "."


def write_numbers_outputs(result: NumbersResult, model_name: str, grid: NumberGrid) -> None:
    """Every table and figure, then metadata.json."""
    from arithmech.report.numbers_plots import helix_projection, ld_by_family

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    atomic_write_text(out / "numbers_ld.csv", csv_text(result.rows, float_format=".5g"))
    atomic_write_json(out / "numbers_periods.json", {"sites": result.periods, "verdicts": result.verdicts})
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
    best = max(rows, key=lambda r: _num(r["restored"]))
    return best["site"], best["layer"], best["family"]


def _circle_coords(fit: Any, means: torch.Tensor, values: torch.Tensor) -> list[tuple[int, float, float]]:
    """(value, x, y): each seen value's mean activation (less the fit's mean) read by least squares on the two
    directions the fit's first circle writes (its cos and sin columns of W)."""
    seen = ~torch.isnan(means[:, 0])
    x = means[seen] - fit.mean  # [seen, d_model]
    start = 1 if fit.family.kind == "helix" else 0
    for t in fit.family.periods:  # the first circle with a sin column (period 2 has cos only)
        if t > 2:
            break
        start += 1
    width = 2 if any(t > 2 for t in fit.family.periods) else 1
    circle = fit.w[:, start : start + width]  # [d_model, 1 or 2]
    coords = torch.linalg.lstsq(circle, x.T).solution.T  # [seen, 1 or 2]
    return [(int(v), float(c[0]), float(c[1]) if width == 2 else 0.0)
            for v, c in zip(values[seen].tolist(), coords, strict=True)]  # fmt: skip
