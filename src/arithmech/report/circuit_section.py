"""The report section of the circuit stage: faithfulness curves, CPR and CMD per ranking, and the circuit drawn.

Reads what stages/circuit.py writes (metadata.json, cpr_cmd.csv, faithfulness.csv, faithfulness.png,
circuit.svg) and says in words how much of the model's logit difference the top edges keep, and at what size.
Nothing is recomputed.
"""

from __future__ import annotations

from typing import Any

from arithmech.report.page import Body, Figure, Table, count, fixed, listing, num, pct, read_drawing, small_samples
from arithmech.report.page import to_float as value
from arithmech.report.run_folder import StageFolder

GOOD_F = 0.8
"""The faithfulness a circuit is called faithful at (the drawn circuit's default, stages/circuit.py)."""
ABOVE_ONE = 0.05
"""How far above 1 an f must be for the reading to explain what f > 1 means (not for rounding)."""
METHOD_NAMES = {"eap": "EAP", "eap-ig": "EAP-IG", "path-patching": "path patching (identify's node ranking)",
                "random": "a random ranking"}  # fmt: skip


def _smallest_faithful(rows: list[dict[str, str]], method: str) -> dict[str, str] | None:
    """The smallest swept circuit of `method` (signed ranking) with f >= GOOD_F."""
    signed = [r for r in rows if r["method"] == method and r["ranking"] == "signed" and value(r["f"]) >= GOOD_F]
    return min(signed, key=lambda r: value(r["percent"])) if signed else None


def _prompt_sentence(meta: dict[str, Any]) -> tuple[str, list[tuple[str, ...]]]:
    """What the prompts were and how many rows the answer filter dropped; the per-source table rows."""
    counts: dict[str, Any] = meta.get("counts", {})
    n = counts.get("prompts", "n/a")
    if counts.get("from"):
        return f"{n} prompt pairs read back from {counts['from']}", []
    filtered = meta.get("answer_filter")
    if not isinstance(filtered, list):
        return f"{n} prompt pairs in MIB's arithmetic format, kept whether the model answers them or not", []
    parts, rows = [], []
    for c in filtered:
        pairs, kept = int(c.get("pairs", 0)), int(c.get("kept", 0))
        drawn, answered = int(c.get("prompts_drawn", 0)), int(c.get("prompts_answered", 0))
        made = (f"the model answers {answered} of {drawn} single prompts drawn ({drawn - answered} dropped); of "
                "the pairs made of them " if drawn else "")  # fmt: skip
        unusable = f"{c['unusable']} rows unusable; " if c.get("unusable") else ""
        parts.append(f"{c.get('source', '?')}: {unusable}{made}{kept} of {pairs} pass ({pairs - kept} dropped: "
                     f"{c.get('clean_missed', 0)} missed on the clean prompt, {c.get('cf_missed', 0)} on the "
                     "counterfactual)")  # fmt: skip
        rows.append((str(c.get("source", "?")), count(drawn) if drawn else "n/a", count(answered) if drawn else "n/a",
                     count(pairs), count(c.get("clean_missed")), count(c.get("cf_missed")), count(kept)))  # fmt: skip
    return (f"{n} prompt pairs in MIB's arithmetic format, kept where the model's top token is the answer on both "
            f"prompts ({'; '.join(parts)})", rows)  # fmt: skip


def circuit_body(stage: StageFolder) -> Body:
    meta = stage.metadata
    config: dict[str, Any] = meta.get("config", {})
    graph: dict[str, Any] = meta.get("graph", {})
    counts: dict[str, Any] = meta.get("counts", {})
    method = str(config.get("method", "n/a"))
    prompts, op_rows = _prompt_sentence(meta)
    text = [
        f"Edges of MIB's graph ({count(graph.get('n_edges'))} edges: input, {graph.get('n_layers', '?')} layers of "
        f"{graph.get('n_heads', '?')} heads and an MLP, logits) ranked by {METHOD_NAMES.get(method, method)} on "
        f"{prompts}."
    ]
    figures, tables = [], []
    if stage.has("cpr_cmd.csv"):
        summary = stage.csv("cpr_cmd.csv")
        rows = stage.csv("faithfulness.csv")
        first = summary[0]
        text.append(
            "f is the share of the model's behaviour that a circuit keeps on its own: its logit difference (answer "
            "minus the counterfactual's answer) rescaled so that the whole model "
            f"({num(value(first['m_full']))}) is 1 and every edge patched from the counterfactual "
            f"({num(value(first['m_empty']))}, {config.get('ablation', 'counterfactual')} ablation) is 0."
        )
        described, table_rows = [], []
        for row in summary:
            name = row["method"]
            smallest = _smallest_faithful(rows, name)
            size = (f"{num(value(smallest['percent']))} % ({count(value(smallest['edges']))} edges)"
                    if smallest else f"none of the swept sizes reaches f >= {GOOD_F:g}")  # fmt: skip
            described.append(f"{METHOD_NAMES.get(name, name)} CPR {fixed(value(row['cpr']))}, CMD "
                             f"{fixed(value(row['cmd']))}, smallest circuit with f >= {GOOD_F:g}: {size}")  # fmt: skip
            table_rows.append((name, fixed(value(row["cpr"]), 3), fixed(value(row["cmd"]), 3),
                               num(value(smallest["percent"])) if smallest else "n/a",
                               count(value(smallest["edges"])) if smallest else "n/a"))  # fmt: skip
        text.append(
            f"Over the swept sizes: {listing(described)}. CPR is the area under f with edges ranked by signed "
            "score (higher is better: a circuit that keeps the behaviour with few edges); CMD the area of |1 - f| "
            "with edges ranked by |score| (lower is better: close to the model at every size)."
        )
        above = sorted({r["method"] for r in rows if r["ranking"] == "signed" and value(r["f"]) > 1 + ABOVE_ONE})
        if above:
            text.append(f"f above 1 ({listing([METHOD_NAMES.get(m, m) for m in above])}) means a circuit pushes the "
                        "answer harder than the whole model: the edges it leaves out include ones that work against "
                        "the answer (negative scores), so CPR can exceed 1.")  # fmt: skip
        best = max(summary, key=lambda r: value(r["cpr"]))
        if len(summary) > 1:
            text.append(f"The highest CPR here is {METHOD_NAMES.get(best['method'], best['method'])}'s.")
        tables.append(Table(f"Faithfulness summary ({counts.get('prompts', 'n/a')} prompts; MIB's CPR and CMD)",
                            ("ranking", "CPR", "CMD", f"smallest f >= {GOOD_F:g} (% of edges)", "its edges"),
                            table_rows))  # fmt: skip
        swept = [(r["method"], r["ranking"], num(value(r["percent"])), count(value(r["edges"])),
                  fixed(value(r["f"]), 3)) for r in rows]  # fmt: skip
        tables.append(Table("f of each swept circuit (faithfulness.csv)",
                            ("ranking", "ranked by", "% of edges", "edges", "f"), swept, collapsed=True))  # fmt: skip
        if stage.has("faithfulness.png"):
            figures.append(Figure(stage.folder / "faithfulness.png",
                                  "Faithfulness f of the top-k % circuits, one curve per ranking: ranked by signed "
                                  "score (left, CPR) and by |score| (right, CMD)."))  # fmt: skip
    else:
        text.append("The faithfulness sweep was not run (evaluate off), so there is no CPR or CMD.")
    if op_rows:
        tables.append(Table("Prompts: the answer filter (a pair is kept only where the model's top token is the answer "
                            "on both of its prompts)", ("source", "single prompts drawn", "answered", "pairs",
                            "missed clean", "missed counterfactual", "kept"), op_rows))  # fmt: skip
    oracle = meta.get("oracle")
    if isinstance(oracle, dict):
        text.append(f"Exact scores of {oracle.get('edges', 'n/a')} sampled edges agree with {method}'s by Spearman "
                    f"{fixed(oracle.get('spearman'))}, top-n overlap {pct(oracle.get('top_n_overlap'))}.")  # fmt: skip
    drawings = []
    if stage.has("circuit.svg"):
        why = (meta.get("drawing") or {}).get("why", "")
        drawings.append(read_drawing(stage.folder / "circuit.svg",
                                     f"The circuit drawn ({why}): blue edges have positive scores, vermillion "
                                     "negative; solid, dashed and dotted edges enter a head's query, key and value; "
                                     "hover an edge for its name and score."))  # fmt: skip
    small = small_samples({"": counts.get("prompts")}, "prompt pair")
    return Body(" ".join(text), figures, tables, small, drawings)
