"""The numbers stage's summaries of numbers_ld.csv: the chosen helix per site and layer, and the verdict per site.

Verdict (`verdicts`), per site (the control site too)
    Readings are ranked by their restored share on the held-out values (`restored_heldout`: values no fit saw),
    never by the share on the train values they were fitted to: a flexible family (a polynomial of 6 terms)
    can restore much on its train values and less than chance on values it did not see. Only a site with no
    held-out share at all (heldout 0) is ranked by the train share, and its verdict says so (`ranked_by`).
    At each layer whose whole-layer effect is estimable (numbers_ld.csv's estimable), the readings (every family
    with a basis in the value: PCA left out) ranked by that share (a cell without one last); the verdict's layer
    is the one whose first reading restores the largest share (as `best_periods` picks a helix's layer). The
    winner is that reading, the runner-up the next at the same layer, and beside them the PCA of the winner's
    size (else the nearest) at that layer: the equal-size baseline, not a reading, since it patches the clean
    value's own projection (no prediction, no order to shuffle); beside an operand-a verdict, the other position's
    control at that layer (`other_position`). Every share is stated on both value sets. The
    order margin is the winner's train share less its shuffled control's; it is "ordered" only where that margin
    exceeds both `ORDER_MARGIN` and `ORDER_SPREADS` times the shuffled control's spread between permutations,
    and (where held-out shares exist) its held-out share beats its shuffled control's held-out share by
    `ORDER_MARGIN` too: else the site shows no ordered structure the patch can use. Shares, not raw LDs, are
    ranked: LD is signed by the clean and corrupted answers, and a run not filtered to correct prompts can have
    the clean LD below the corrupted one, where the largest LD is the patch that restores least.

Chosen helix (`best_periods`), per site and layer: the fewest periods within `PARSIMONY` of the best helix's
share, ranked by the same share as the verdict.
"""

from __future__ import annotations

import math
from typing import Any

ORDER_MARGIN = 0.1
"""A family's restored share must beat its shuffled control's by this much to count as ordered structure."""
ORDER_SPREADS = 2.0
"""... and by this many of the shuffled control's standard deviations between permutations (when it has two)."""
PARSIMONY = 0.05
"""The chosen helix restores at least the best helix's share less this (`chosen_helix`)."""


def sort_key(value: Any) -> float:
    """A share as a sort key: -inf where it is empty (None or NaN), so an empty cell ranks last."""
    return float(value) if value is not None and not (isinstance(value, float) and math.isnan(value)) else -math.inf


def ranking_share(rows: list[dict[str, Any]]) -> str:
    """The column a site's readings are ranked by: "restored_heldout" where any of `rows` (one site's) has a
    held-out share, else "restored" (a run with no held-out values)."""
    return "restored_heldout" if any(r.get("restored_heldout") is not None for r in rows) else "restored"


def best_periods(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """numbers_periods.json: per site and layer the chosen helix (`chosen_helix`); per site the layer where the
    chosen helix restores the largest share (the site's `ranking_share`, named as "ranked_by")."""
    out: dict[str, Any] = {}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        if row["kind"] == "helix" and row["restored"] is not None:
            groups.setdefault((row["site"], row["layer"]), []).append(row)
    keys = {site: ranking_share([r for r in rows if r["site"] == site]) for site, _ in groups}
    for (site, layer), helices in groups.items():
        key = keys[site]
        pick = chosen_helix(helices, key)
        entry = out.setdefault(site, {"per_layer": {}, "best": None, "ranked_by": key})
        entry["per_layer"][str(layer)] = {
            "family": pick["family"], "periods": [int(t) for t in str(pick["periods"]).split("-") if t],
            **{k: pick.get(k) for k in ("ld", "ld_shuffled", "ld_layer", "restored", "restored_shuffled",
                                        "ld_heldout", "restored_heldout")},
            "best_family": max(helices, key=lambda r: sort_key(r.get(key)))["family"],
        }  # fmt: skip
    for site, entry in out.items():
        layer, best = max(entry["per_layer"].items(), key=lambda kv: sort_key(kv[1][keys[site]]))
        entry["best"] = {"layer": int(layer), **best}
    return out


def chosen_helix(helices: list[dict[str, Any]], key: str = "restored_heldout") -> dict[str, Any]:
    """The helix with the fewest periods whose share `key` is within `PARSIMONY` of the best helix's (a superset
    of the right periods restores as much, with dimensions to spare); ties by that share."""
    top = max(sort_key(r.get(key)) for r in helices)
    near = [r for r in helices if sort_key(r.get(key)) >= top - PARSIMONY]
    return min(near, key=lambda r: (len(str(r["periods"]).split("-")), -sort_key(r.get(key))))


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The verdict of the module docstring, one dict per site."""
    out = []
    sites = list(dict.fromkeys(r["site"] for r in rows))
    for site in sites:
        mine = [r for r in rows if r["site"] == site]
        key = ranking_share(mine)
        whole = {r["layer"]: r for r in mine if r["kind"] == "layer" and r.get("estimable", 1)}  # else no verdict
        per_layer = {layer: sorted((r for r in mine if r["layer"] == layer and r["kind"] not in ("layer", "pca")),
                                   key=lambda r: -sort_key(r.get(key))) for layer in whole}  # fmt: skip
        per_layer = {layer: ranked for layer, ranked in per_layer.items() if ranked}
        if not per_layer:
            continue
        layer = max(per_layer, key=lambda la: sort_key(per_layer[la][0].get(key)))
        top, ranked = whole[layer], per_layer[layer]
        win = ranked[0]
        second = ranked[1] if len(ranked) > 1 else None
        pcas = [r for r in mine if r["layer"] == layer and r["kind"] == "pca"]
        pca = min(pcas, key=lambda r: (abs(int(r["dim"]) - int(win["dim"] or 0)), -int(r["dim"]))) if pcas else None
        order = sort_key(win["restored"]) - sort_key(win["restored_shuffled"])
        spread = sort_key(win.get("restored_shuffled_sd"))
        held_order = sort_key(win.get("restored_heldout")) - sort_key(win.get("restored_shuffled_heldout"))
        ordered = (win["restored_shuffled"] is not None and order > ORDER_MARGIN
                   and (not math.isfinite(spread) or order > ORDER_SPREADS * spread)
                   and (key == "restored" or held_order > ORDER_MARGIN))  # fmt: skip
        out.append({
            "site": site, "control": bool(top["control"]), "layer": layer, "ranked_by": key,
            "pairs": top.get("pairs"), "heldout_pairs": top.get("heldout_pairs"),
            "ld_layer": top["ld"], "ld_clean": top["ld_clean"], "ld_corrupted": top["ld_corrupted"],
            "winner": win["family"], "ld": win["ld"], "restored": win["restored"], "ld_shuffled": win["ld_shuffled"],
            "restored_shuffled": win["restored_shuffled"], "runner_up": second["family"] if second else None,
            "ld_runner_up": second["ld"] if second else None,
            "restored_runner_up": second["restored"] if second else None,
            "restored_heldout_runner_up": second.get("restored_heldout") if second else None,
            "ld_heldout": win.get("ld_heldout"), "restored_heldout": win.get("restored_heldout"),
            "restored_shuffled_heldout": win.get("restored_shuffled_heldout"),
            "restored_shuffled_sd": win.get("restored_shuffled_sd"),
            "ablation_lost": win.get("ablation_lost"), "random_lost": win.get("random_lost"),
            "pca": pca["family"] if pca else None, "restored_pca": pca["restored"] if pca else None,
            "restored_heldout_pca": pca.get("restored_heldout") if pca else None,
            "pca_same_size": bool(pca and int(pca["dim"]) == int(win["dim"] or 0)),
            "ordered": ordered, "order_margin": order if math.isfinite(order) else None,
            **(other_position(rows, win, layer, key) if top.get("variable") == "a" and not top["control"] else {}),
        })  # fmt: skip
    return out


def other_position(rows: list[dict[str, Any]], win: dict[str, Any], layer: int, key: str) -> dict[str, Any]:
    """The control beside an operand-a verdict: at the same layer, a's readings fitted and patched at b's token
    (the control site, where a is not written): whether the whole layer's patch there moves LD enough for a
    share, and the share (as ranked) of the winner's family, else of the control's best reading."""
    mine = [r for r in rows if r["control"] and r["layer"] == layer]
    whole = next((r for r in mine if r["kind"] == "layer"), None)
    if whole is None:
        return {}
    readings = [r for r in mine if r["kind"] not in ("layer", "pca")]
    same = [r for r in readings if r["family"] == win["family"]]
    pick = same[0] if same else max(readings, key=lambda r: sort_key(r.get(key)), default=None)
    return {"other_site": whole["site"], "other_estimable": bool(whole.get("estimable", 1)),
            "other_family": pick["family"] if pick else None,
            "restored_other": pick.get(key) if pick and whole.get("estimable", 1) else None}  # fmt: skip


def verdict_sentence(v: dict[str, Any]) -> str:
    """One sentence in words: which reading wins at a site, by how much, against its controls."""

    def f(x: Any) -> str:
        return "n/a" if x is None else f"{float(x):.2f}"

    def pct(x: Any) -> str:
        return "n/a" if x is None else f"{float(x):.0%}"

    held = v.get("ranked_by", "restored") == "restored_heldout"

    def both(ranked: Any, train: Any) -> str:
        """A share as ranked, with the train values' beside it (or the train values' alone)."""
        return f"{pct(ranked)} held out, {pct(train)} train" if held else pct(train)

    head = (f"{v['site']}: at layer {v['layer']} (whole layer LD {f(v['ld_layer'])}, clean {f(v['ld_clean'])}, "
            f"corrupted {f(v['ld_corrupted'])}) {v['winner']} restores the most"
            + (f" of the whole layer's effect on held-out values ({v.get('heldout_pairs', '?')} pairs), "
               f"{pct(v.get('restored_heldout'))}, and "
               f"{pct(v['restored'])} on train values ({v.get('pairs', '?')} pairs; LD {f(v['ld'])})" if held else
               f", {pct(v['restored'])} of the whole layer's effect on train values (LD {f(v['ld'])}; no held-out "
               "values to rank by)"))  # fmt: skip
    if v["runner_up"] is not None:
        runner = both(v.get("restored_heldout_runner_up"), v.get("restored_runner_up"))
        head += f", ahead of {v['runner_up']} ({runner})"
    if v.get("pca") is not None:
        size = "equal size" if v.get("pca_same_size") else "the nearest size"
        head += (f"; PCA of {size} ({v['pca']}, its own activation projected) "
                 f"{both(v.get('restored_heldout_pca'), v.get('restored_pca'))}")  # fmt: skip
    sd = v.get("restored_shuffled_sd")
    shuffled = f"{pct(v['restored_shuffled'])}{'' if sd is None else f' (sd {pct(sd)})'} on train values"
    if held:
        shuffled += f", {pct(v.get('restored_shuffled_heldout'))} held out"
    controls = (f"; shuffled control {shuffled}, ablating its subspace loses {pct(v['ablation_lost'])} of the LD vs "
                f"{pct(v['random_lost'])} for a random one")  # fmt: skip
    if v.get("other_site") is not None:
        controls += f"; at the other operand's position ({v['other_site']}) " + (
            f"{v['other_family']} restores {pct(v.get('restored_other'))}" if v["other_estimable"] and v["other_family"]
            else "the whole layer moves LD too little for a share")  # fmt: skip
    where = f" on train values, or not by {ORDER_MARGIN * 100:g} points on held-out values" if held else ""
    tail = "" if v["ordered"] else (f"; it does not beat its shuffled control beyond the control's spread{where}, so "
                                    "no ordered reading wins here")  # fmt: skip
    return head + controls + tail + "."
