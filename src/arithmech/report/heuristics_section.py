"""Report section of the heuristics stage (Nikankin et al. 2025): read layers.csv, ablation.csv and metadata.json
of a finished folder and write the reading from their numbers; nothing is recomputed."""

from __future__ import annotations

from typing import Any

from arithmech.report.page import Body, Figure, Table, listing, pct, small_samples, to_float
from arithmech.report.run_folder import StageFolder
from arithmech.report.sections import plural

_GROUPS = ("operand", "result")
_MARGIN = 0.01
"""A family's classified share counts as above its null when it exceeds it by more than this."""


def _family_name(column: str) -> str:
    return column.removeprefix("family_").replace("_", " ")


def _overlap(mine: list[dict[str, str]], n: int) -> dict[str, Any]:
    """The families' overlap in one operation's layers: the share classified by both, its null, and a sentence
    (empty for a folder written before layers.csv had the overlap columns)."""
    if "overlap_both" not in mine[0]:
        return {"both": None, "null": None, "text": ""}
    count = {c: sum(int(r[f"overlap_{c}"]) for r in mine) for c in ("operand_only", "result_only", "both")}
    null = sum(to_float(r["overlap_both_null_fraction"]) * int(r["neurons"]) for r in mine) / n
    result = count["result_only"] + count["both"]
    also = (f"{count['both']} of the {result} neurons that match a result template ({pct(count['both'] / result)}) "
            "match an operand template too" if result else "no neuron matches a result template")  # fmt: skip
    text = (f"The families overlap: {also}; {count['operand_only']} match operand templates only and "
            f"{count['result_only']} result templates only; both families classify {pct(count['both'] / n, 1)} of "
            f"the neurons (null {pct(null, 1)}). ")  # fmt: skip
    return {"both": count["both"] / n, "null": null, "text": text}


def heuristics_body(stage: StageFolder) -> Body:
    meta: dict[str, Any] = stage.metadata
    layers = stage.csv("layers.csv")
    ablation = stage.csv("ablation.csv")
    one_percent = int(meta.get("one_percent_k", 1))
    ks = sorted({int(r["k"]) for r in ablation if int(r["k"]) > 0})
    one = one_percent if one_percent in ks or not ks else ks[0]
    one_note = " (1% of a layer)" if one == one_percent else ""
    answered = meta.get("config", {}).get("filter_correct", True)
    pairs_word = "answered grid pairs" if answered else "grid pairs, answered or not"
    ops = list(dict.fromkeys(r["operation"] for r in layers))
    text, rows = [], []
    for op in ops:
        mine = [r for r in layers if r["operation"] == op]
        n = sum(int(r["neurons"]) for r in mine)
        n_strong = sum(int(r["strong_neurons"]) for r in mine)
        share = {g: sum(int(r[f"{g}_classified"]) for r in mine) / n for g in _GROUPS}
        null = {g: sum(to_float(r[f"{g}_null_fraction"]) * int(r["neurons"]) for r in mine) / n for g in _GROUPS}
        strong = {g: sum(to_float(r[f"{g}_strong_fraction"]) * int(r["strong_neurons"]) for r in mine) / n_strong
                  for g in _GROUPS}  # fmt: skip
        families = [c for c in mine[0] if c.startswith("family_")]
        shares = {c: sum(to_float(r[c]) * int(r["neurons"]) for r in mine) / n for c in families}
        ranked = [c for c in sorted(shares, key=lambda c: -shares[c]) if shares[c] > 0][:3]
        cells = [r for r in ablation if r["operation"] == op]
        base = next(to_float(r["accuracy"]) for r in cells if r["selection"] == "none")

        def at(selection: str, ablation_kind: str, k: int = one, cells: list[dict[str, str]] = cells) -> float | None:
            values = [to_float(r["accuracy"]) for r in cells
                      if (r["selection"], r["ablation"], int(r["k"])) == (selection, ablation_kind, k)]  # fmt: skip
            return sum(values) / len(values) if values else None

        prompts = cells[0]["prompts"] if cells else "?"
        top_mean, random_mean = at("top", "mean"), at("random", "mean")
        verdict = ""
        if top_mean is not None and random_mean is not None:
            gap = random_mean - top_mean
            verdict = (f"; the top neurons matter {'more' if gap > 0.05 else 'no more'} than random ones"
                       if base else "")  # fmt: skip
        readings = [f"{g} templates {pct(share[g], 1)} (null {pct(null[g], 1)}: "
                    f"{'above' if share[g] > null[g] + _MARGIN else 'not above'} it)" for g in _GROUPS]  # fmt: skip
        overlap = _overlap(mine, n)
        most = (f"; most often {listing([f'{_family_name(c)} ({pct(shares[c])})' for c in ranked])}"
                if ranked else "")  # fmt: skip
        text.append(
            f"{op.capitalize()} ({prompts} {pairs_word}): of the neurons of layers {mine[0]['layer']}-"
            f"{mine[-1]['layer']}, {' and '.join(readings)} match a template by their activation{most}. "
            f"{overlap['text']}Mean-ablating each prompt's top {plural(one, 'neuron')} per layer by direct "
            f"effect{one_note} takes accuracy from {pct(base)} to {pct(top_mean)}, vs {pct(random_mean)} for {one} "
            f"random (zero ablation: {pct(at('top', 'zero'))} vs {pct(at('random', 'zero'))}){verdict}."
        )  # fmt: skip
        rows.append((op, str(prompts), *(pct(x[g], 1) for g in _GROUPS for x in (share, null)),
                     pct(overlap["both"], 1), pct(overlap["null"], 1),
                     pct(strong["operand"]), pct(strong["result"]), pct(base),
                     pct(at("top", "mean")), pct(at("random", "mean")), pct(at("top", "zero")),
                     pct(at("random", "zero"))))  # fmt: skip
    text.append(
        "Nikankin et al. report for Llama3-8B that about 1% of the neurons per layer suffice (a heuristic neuron "
        "each) and that ablating a prompt's heuristic neurons drops its accuracy far more than random ones. Here "
        "every template is matched on the activation alone, and each family is read against its null: the same "
        "rule on each neuron's activations permuted over the grid pairs. On a grid of single-digit operands the "
        "templates are coarse and a match must be near-perfect to pass."
    )
    tables = [Table(
        f"Per operation: neurons classified per template family (null: activations permuted), and accuracy after "
        f"ablating k = {one} neurons per layer{one_note}",
        ("operation", "pairs", "operand", "operand null", "result", "result null", "both", "both null",
         "strongest 1%: operand",
         "strongest 1%: result", "accuracy", "top-k mean", "random-k mean", "top-k zero", "random-k zero"), rows,
    )]  # fmt: skip
    tables.append(Table(
        "Every layer (operand only, result only, both: neurons classified by one family or by both)",
        ("operation", "layer", "operand", "operand null", "result", "result null", "operand only", "result only",
         "both", "both null"),
        [(r["operation"], r["layer"], *(pct(to_float(r[f"{g}_{c}"]), 1) for g in _GROUPS
                                        for c in ("fraction", "null_fraction")),
          *(r.get(f"overlap_{c}", "n/a") for c in ("operand_only", "result_only", "both")),
          pct(to_float(r.get("overlap_both_null_fraction")), 1)) for r in layers], collapsed=True,
    ))  # fmt: skip
    figures = [Figure(stage.folder / name, caption) for name, caption in (
        ("heuristic_types.png", "Share of each layer's neurons classified, by template family (left bar: operand "
                                "templates, right: result templates; middle, grey: classified by both, counted in "
                                "both side bars too); black ticks: each bar's null."),
        ("activation_patterns.png", "Activation at the last token over the operand grid (A rows, B columns) of the "
                                    "strongest neurons by mean |direct effect|, with their best template."),
        ("ablation.png", "Accuracy after ablating each prompt's top-k neurons per layer by direct effect vs k random "
                         "ones (mean and zero ablation); dotted: 1% of a layer."),
    ) if stage.has(name)]  # fmt: skip
    sizes = {op: meta.get("grid", {}).get(op, {}).get("kept") for op in ops}
    return Body(" ".join(text), figures, tables, small_samples(sizes, "answered grid pair"))
