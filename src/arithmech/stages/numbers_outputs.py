"""The analyze-numbers stage's summaries and files: the chosen periods, the verdict per site, and the writer.

Verdict (`verdicts`), per site (the control site too)
    At each layer whose whole-layer effect is estimable (numbers_ld.csv's estimable), the readings (every family
    with a basis in the value: PCA left out) ranked by their restored share (a cell without a share last); the
    verdict's layer is the one whose first reading restores the largest share (as `best_periods` picks a helix's
    layer). The winner is that reading, the runner-up the next at the same layer, and beside them the PCA of
    the winner's size (else the nearest) at that layer: the equal-size baseline, not a reading, since it patches
    the clean value's own projection (no prediction, no order to shuffle). The order margin is the winner's
    share less its shuffled control's; it is "ordered" only where that margin exceeds both `ORDER_MARGIN` and
    `ORDER_SPREADS` times the shuffled control's spread between permutations: else the site shows no ordered
    structure the patch can use. Shares, not raw LDs, are ranked: LD is signed by the clean
    and corrupted answers, and a run not filtered to correct prompts can have the clean LD below the corrupted
    one, where the largest LD is the patch that restores least.
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
ORDER_SPREADS = 2.0
"""... and by this many of the shuffled control's standard deviations between permutations (when it has two)."""
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
        whole = {r["layer"]: r for r in mine if r["kind"] == "layer" and r.get("estimable", 1)}  # else no verdict
        per_layer = {layer: sorted((r for r in mine if r["layer"] == layer and r["kind"] not in ("layer", "pca")),
                                   key=lambda r: -_num(r["restored"])) for layer in whole}  # fmt: skip
        per_layer = {layer: ranked for layer, ranked in per_layer.items() if ranked}
        if not per_layer:
            continue
        layer = max(per_layer, key=lambda la: _num(per_layer[la][0]["restored"]))
        top, ranked = whole[layer], per_layer[layer]
        win = ranked[0]
        second = ranked[1] if len(ranked) > 1 else None
        pcas = [r for r in mine if r["layer"] == layer and r["kind"] == "pca"]
        pca = min(pcas, key=lambda r: (abs(int(r["dim"]) - int(win["dim"] or 0)), -int(r["dim"]))) if pcas else None
        order = _num(win["restored"]) - _num(win["restored_shuffled"])
        spread = _num(win.get("restored_shuffled_sd"))
        ordered = (win["restored_shuffled"] is not None and order > ORDER_MARGIN
                   and (not math.isfinite(spread) or order > ORDER_SPREADS * spread))  # fmt: skip
        out.append({
            "site": site, "control": bool(top["control"]), "layer": layer, "ld_layer": top["ld"],
            "ld_clean": top["ld_clean"], "ld_corrupted": top["ld_corrupted"], "winner": win["family"],
            "ld": win["ld"], "restored": win["restored"], "ld_shuffled": win["ld_shuffled"],
            "restored_shuffled": win["restored_shuffled"], "runner_up": second["family"] if second else None,
            "ld_runner_up": second["ld"] if second else None,
            "restored_runner_up": second["restored"] if second else None, "ld_heldout": win.get("ld_heldout"),
            "restored_heldout": win.get("restored_heldout"), "restored_shuffled_sd": win.get("restored_shuffled_sd"),
            "ablation_lost": win.get("ablation_lost"), "random_lost": win.get("random_lost"),
            "pca": pca["family"] if pca else None, "restored_pca": pca["restored"] if pca else None,
            "pca_same_size": bool(pca and int(pca["dim"]) == int(win["dim"] or 0)),
            "ordered": ordered, "order_margin": order if math.isfinite(order) else None,
        })  # fmt: skip
    return out


def verdict_sentence(v: dict[str, Any]) -> str:
    """One sentence in words: which reading wins at a site, by how much, against its controls."""

    def f(x: Any) -> str:
        return "n/a" if x is None else f"{float(x):.2f}"

    def pct(x: Any) -> str:
        return "n/a" if x is None else f"{float(x):.0%}"

    head = (f"{v['site']}: at layer {v['layer']} (whole layer LD {f(v['ld_layer'])}, clean {f(v['ld_clean'])}, "
            f"corrupted {f(v['ld_corrupted'])}) {v['winner']} restores the most, {pct(v['restored'])} of the whole "
            f"layer's effect (LD {f(v['ld'])})")  # fmt: skip
    if v["runner_up"] is not None:
        head += f", ahead of {v['runner_up']} ({pct(v.get('restored_runner_up'))})"
    if v.get("pca") is not None:
        size = "equal size" if v.get("pca_same_size") else "the nearest size"
        head += f"; PCA of {size} ({v['pca']}, its own activation projected) {pct(v.get('restored_pca'))}"
    sd = v.get("restored_shuffled_sd")
    controls = (f"; shuffled control {pct(v['restored_shuffled'])}{'' if sd is None else f' (sd {pct(sd)})'}, "
                f"held-out values {pct(v.get('restored_heldout'))}, ablating its subspace loses "
                f"{pct(v['ablation_lost'])} of the LD vs {pct(v['random_lost'])} for a random one")  # fmt: skip
    tail = "" if v["ordered"] else ("; it does not beat its shuffled control beyond the control's spread, so no "
                                    "ordered reading wins here")  # fmt: skip
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
