"""The answer-digits parts of the identify, knockout and attention sections: per answer place.

An identify run of --answer-digits writes effects_by_place.csv and place_overlap.csv, a knockout of it
knockout_place_summary.csv, the attention analysis of it attention_by_place.csv (`stages/identify.py`,
`stages/knockout.py`, `stages/analyze_attention.py`), each indexed by the place value of the scored digit (units,
tens, hundreds, `data/places.py`); these builders read them and say which components write which digit, whether
the places share their top components, how knockout moves each digit, and which operand token each head reads
while each digit is written. Nothing is recomputed.
"""

from __future__ import annotations

from arithmech.report.page import Figure, Table, fixed, listing, pct, signed_pct, to_float
from arithmech.report.run_folder import StageFolder

TOP = 5


def identify_places(stage: StageFolder) -> tuple[str, list[Figure], list[Table]]:
    """(reading, per-place heatmaps, top components per place and group) of an answer-digits identify run."""
    rows = stage.csv("effects_by_place.csv")
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["place"], r["group"]), []).append(r)
    table_rows, text = [], []
    for (place, group), members in groups.items():
        ranked = sorted(members, key=lambda r: to_float(r["effect"]))[:TOP]
        cells = ", ".join(f"{r['component']} ({signed_pct(to_float(r['effect']))})" for r in ranked)
        table_rows.append((place, group, members[0]["prompts"], cells))
        if group == "all":
            head = next((r for r in sorted(members, key=lambda r: to_float(r["effect"])) if r["kind"] == "head"), None)
            mlp = next((r for r in sorted(members, key=lambda r: to_float(r["effect"])) if r["kind"] == "mlp"), None)
            strongest = [f"{r['component']} ({signed_pct(to_float(r['effect']))})" for r in (head, mlp) if r]
            text.append(f"the {place} digit ({members[0]['prompts']} prompts): {listing(strongest)}")
    reading = "Scored digit by digit (teacher forcing), the strongest head and MLP per answer place are " + (
        "; ".join(text) + "."
    )
    carry = stage.metadata.get("carry_accuracy") or {}
    if carry:
        answered = [f"{group} {pct(v.get('accuracy'))} of {v.get('pairs')}" for group, v in carry.items()]
        reading += f" Before sampling the model answered {listing(answered)} pairs."
    if stage.has("place_overlap.csv"):
        overlap = stage.csv("place_overlap.csv")
        k = "top10_overlap" if "top10_overlap" in overlap[0] else next(c for c in overlap[0] if c.endswith("overlap"))
        shared = [f"{r['place_a']} and {r['place_b']} {pct(to_float(r[k]))} (Spearman "
                  f"{fixed(to_float(r['spearman']))})" for r in overlap]  # fmt: skip
        reading += f" Their {k.removesuffix('_overlap').replace('top', 'top-')} components overlap: {listing(shared)}."
    places = list(dict.fromkeys(place for place, _ in groups))  # from the units up, as the table lists them
    figures = [
        Figure(stage.folder / f"effects_heatmap_{p}.png", f"Path-patching effect on the answer's {p} digit.")
        for p in places
        if stage.has(f"effects_heatmap_{p}.png")
    ]
    table = Table(f"Top {TOP} components per answer place and carry group", ("place", "group", "prompts",
                  "components (effect)"), table_rows)  # fmt: skip
    return reading, figures, [table]


def knockout_places(stage: StageFolder) -> tuple[str, list[Table]]:
    """(reading, accuracy per answer place, carry group and k) of a knockout of answers scored token by token; the
    reading is of the first prompt set (held out, where there is one), the table has every set."""
    summary = stage.csv("knockout_place_summary.csv")
    first = summary[0].get("prompt_set", "")
    kmax = max(int(r["k"]) for r in summary)
    at_max = [r for r in summary if int(r["k"]) == kmax and r.get("prompt_set", "") == first]
    parts = [f"{r['place']} {pct(to_float(r['effect_accuracy']))} (random "
             f"{pct(to_float(r['random_accuracy_mean']))})" for r in at_max
             if r["group"] == "all" and r["place"] != "answer"]  # fmt: skip
    groups = [f"{r['group']} {pct(to_float(r['effect_accuracy']))} (random {pct(to_float(r['random_accuracy_mean']))})"
              for r in at_max if r["group"] != "all" and r["place"] == "answer"]  # fmt: skip
    on = {"held_out": " on the held-out prompts", "in_sample": " in sample"}.get(first, "")
    reading = (f" Accuracy is of whole answers (every digit right); per answer place{on}, with the top {kmax} "
               f"knocked out: {listing(parts)}.")  # fmt: skip
    if groups:
        reading += f" Whole answers by carry group: {listing(groups)}."
    named = bool(first)
    rows = [((r["prompt_set"].replace("_", " "),) if named else ()) + (
             r["place"], r["group"], r["prompts"], r["k"], pct(to_float(r["effect_accuracy"])),
             f"{pct(to_float(r['random_accuracy_mean']))} ± {pct(to_float(r['random_accuracy_std']))}")
            for r in summary]  # fmt: skip
    columns = ("place", "group", "prompts", "k", "effect-rank accuracy", "random accuracy (mean ± sd)")
    return reading, [Table("Accuracy per answer place (teacher forced; 'answer': whole answers) and carry group "
                           "with k knocked out", (("prompt set",) if named else ()) + columns, rows,
                           collapsed=True)]  # fmt: skip


OPERAND_TOKENS = ("A[-2]", "A[-1]", "B[-2]", "B[-1]")


def attention_places(stage: StageFolder) -> tuple[str, Table]:
    """(reading, mass on each operand token per head and answer place) of an attention analysis of answers
    scored token by token."""
    rows = stage.csv("attention_by_place.csv")
    strongest = []
    for r in rows:
        token = max(OPERAND_TOKENS, key=lambda c: to_float(r[c]))
        if to_float(r[token]) >= 0.3:
            strongest.append(f"{r['head']} at the {r['place']} digit on {token} ({pct(to_float(r[token]))})")
    reading = " Per answer place (teacher forcing), the operand token each head reads most: " + (
        f"{listing(strongest, limit=12)}." if strongest else "no head puts 30% or more on one operand token."
    )
    reading += " A[-1] is A's last token (its units digit where digits are split), A[-2] the one before."
    table = Table("END attention on each operand token per answer place", ("head", "place", *OPERAND_TOKENS,
                  "label"), [(r["head"], r["place"], *(f"{to_float(r[c]):.2f}" for c in OPERAND_TOKENS), r["label"])
                  for r in rows], collapsed=True)  # fmt: skip
    return reading, table
