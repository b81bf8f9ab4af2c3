"""Report section of the numbers stage (Kantamneni & Tegmark 2025 and rival readings): read numbers_ld.csv,
numbers_periods.json and metadata.json of a finished folder and say in words which reading wins where; nothing is
recomputed (the verdict sentences are written by the stage into metadata.json from the same table)."""

from __future__ import annotations

import math
from typing import Any

from arithmech.report.page import Body, Figure, Table, num, pct, to_float
from arithmech.report.run_folder import StageFolder


def numbers_body(stage: StageFolder) -> Body:
    meta: dict[str, Any] = stage.metadata
    rows = stage.csv("numbers_ld.csv")
    span = meta.get("range", {})
    periods = stage.json("numbers_periods.json").get("sites", {})
    reading = "one place per token (per-digit reading)" if span.get("digit_split") else "one token per operand"
    text = [
        f"Operands {span.get('low')}..{int(span.get('high', 0)) - 1}, {reading}; periods {span.get('periods')}. "
        "Each family is fitted on 80% of the operand values in a PCA of the site's activations and judged by the "
        "logit difference (LD) its patch restores in a run whose operand was changed, against the whole residual "
        "patched; controls: the held-out values, the basis shuffled over the values, "
        + (f"the fit at the other operand's token (site {meta['control_site']}) " if meta.get("control_site") else "")
        + "and ablating the fitted vs a random subspace. "
        "The patch writes the fit's out-of-sample prediction of the clean value into its subspace (the rest from "
        "the corrupted run), and its share is measured from the same fit's patch of another value, so a fit "
        "with no order (the shuffled control) restores about 0. Readings are ranked by the share they restore on "
        "the held-out values (a flexible family can fit its train values and fail on values it did not see), "
        "with the train values' share beside it. Where the whole-layer patch barely moves LD the "
        "cell is not estimable: its shares are left empty, with the reason in the table "
        f"({sum(1 for r in rows if r.get('estimable') == '0')} of {len(rows)} rows here).",
        *meta.get("verdicts", []),
    ]
    for site, entry in periods.items():
        best = entry.get("best")
        if best:
            text.append(f"{site}: the chosen helix is {best['family']} (periods {best['periods']}) at layer "
                        f"{best['layer']}, restoring {pct(to_float(best.get('restored_heldout')))} on held-out values "
                        f"and {pct(to_float(best['restored']))} on train values vs "
                        f"{pct(to_float(best['restored_shuffled']))} shuffled.")  # fmt: skip
    clock = meta.get("clock") or {}
    if clock:
        text.append("The Clock (Kantamneni & Tegmark's addition on a helix): at the last token, helix(a, b, a+b) "
                    "against helix(a+b), helix(a, b) and a PCA of equal size, each correct prompt (a, b) a row of "
                    "the fits, judged by the same patching with a changed (numbers_clock.csv).")  # fmt: skip
        text += [*clock.get("verdicts", []), *([clock["head_order"]] if clock.get("head_order") else [])]
    text.append(f"Cost: {num(meta.get('forward_pass_equivalents', {}).get('total'))} forward passes of the prompt "
                "set in all.")  # fmt: skip
    held = any(r.get("restored_heldout") for r in rows)
    key = "restored_heldout" if held else "restored"
    shares = {id(r): to_float(r[key]) for r in rows}
    top = sorted((r for r in rows if r["kind"] != "layer"),
                 key=lambda r: -shares[id(r)] if not math.isnan(shares[id(r)]) else math.inf)  # empty cells last
    table = Table(
        f"Best (site, layer, family) cells by restored share of the whole layer's LD on "
        f"{'held-out' if held else 'train'} values, with their controls",
        ("site", "layer", "family", "LD", "whole layer", "restored, held-out values", "restored, train values",
         "shuffled", "ablation lost", "random lost"),
        [(r["site"], r["layer"], r["family"], num(to_float(r["ld"])), num(to_float(r["ld_layer"])),
          pct(to_float(r["restored_heldout"])), pct(to_float(r["restored"])), pct(to_float(r["restored_shuffled"])),
          pct(to_float(r["ablation_lost"])), pct(to_float(r["random_lost"]))) for r in top[:15]],
    )  # fmt: skip
    figures = [Figure(stage.folder / "numbers_ld.png", "LD per layer by reading (best family of each kind), the best "
                      "helix's shuffled control dashed, the corrupted run grey")] if stage.has("numbers_ld.png") else []
    tables = [table] if top else []
    if stage.has("numbers_clock_heads.csv"):
        heads = stage.csv("numbers_clock_heads.csv")
        tables.append(Table(
            "Key heads by the share of their effect the helices explain (c_ab: helix(a, b); c_sum: helix(a+b); "
            "c_joint: helix(a, b, a+b); held-out pairs, then train pairs)",
            ("head", "class", "c_ab held-out", "c_sum held-out", "c_joint held-out", "c_ab train", "c_sum train",
             "c_joint train", "head's share of the LD"),
            [(r["head"], r["class"], *(pct(to_float(r[c])) for c in ("c_ab_heldout", "c_sum_heldout",
              "c_joint_heldout", "c_ab", "c_sum", "c_joint", "head_share"))) for r in heads],
        ))  # fmt: skip
    if stage.has("numbers_helix.png"):
        figures.append(Figure(stage.folder / "numbers_helix.png", "operand means on the best helix's first circle, "
                              "coloured by the operand, beside the same for the shuffled control"))  # fmt: skip
    return Body(" ".join(text), figures, tables)
