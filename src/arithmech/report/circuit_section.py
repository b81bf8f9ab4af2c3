"""The report section of the circuit stage: faithfulness curves, CPR and CMD per ranking, and the circuit drawn.

Reads what stages/circuit.py writes (metadata.json, cpr_cmd.csv, faithfulness.csv, file_circuit.csv,
faithfulness.png, circuit.svg) and says in words how much of the model's logit difference the top edges keep, at
what size, and on which pairs: held-out test pairs (the default, as MIB evaluates on a split the circuit was not
found on) or the pairs the edges were scored on ("in-sample", said wherever a number is; so is every folder
written before held-out evaluation, whose files name no pairs). Nothing is recomputed.
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
                "random": "a random ranking", "file": "the circuit file's scores"}  # fmt: skip
IN_SAMPLE = "in-sample"


def _curve(row: dict[str, str]) -> bool:
    """A faithfulness.csv row of a method's curve (for the random ranking the mean over seeds, not one seed)."""
    return row.get("draw", "") in ("", "mean")


def _smallest_faithful(rows: list[dict[str, str]], method: str) -> dict[str, str] | None:
    """The smallest swept circuit of `method` (signed ranking) with f >= GOOD_F."""
    signed = [r for r in rows if r["method"] == method and r["ranking"] == "signed" and _curve(r)
              and value(r["f"]) >= GOOD_F]  # fmt: skip
    return min(signed, key=lambda r: value(r["percent"])) if signed else None


def _filter_parts(meta: dict[str, Any]) -> dict[str, list[dict[str, Any]]] | None:
    """The answer filter's counts per set ("find", "test"); a folder of before the split gives one list (find)."""
    filtered = meta.get("answer_filter")
    if isinstance(filtered, list):
        return {"find": filtered}
    return filtered if isinstance(filtered, dict) else None


def _prompt_sentence(meta: dict[str, Any]) -> tuple[str, list[tuple[str, ...]]]:
    """What the find pairs were and how many rows the answer filter dropped; the per-set, per-source table rows."""
    counts: dict[str, Any] = meta.get("counts", {})
    n = counts.get("find_pairs", counts.get("prompts", "n/a"))
    noun = "find pairs" if "find_pairs" in counts else "prompt pairs"  # a folder of before the split: one set
    if counts.get("from"):
        return f"{n} {noun} read back from {counts['from']}", []
    parts = _filter_parts(meta)
    if parts is None:
        return f"{n} {noun} in MIB's arithmetic format, kept whether the model answers them or not", []
    said, rows = [], []
    for part, filtered in parts.items():
        for c in filtered:
            pairs, kept = int(c.get("pairs", 0)), int(c.get("kept", 0))
            drawn, answered = int(c.get("prompts_drawn", 0)), int(c.get("prompts_answered", 0))
            made = (f"the model answers {answered} of {drawn} single prompts drawn ({drawn - answered} dropped); of "
                    "the pairs made of them " if drawn else "")  # fmt: skip
            why = f" ({c['unusable_why']})" if c.get("unusable_why") else ""
            unusable = f"{c['unusable']} rows unusable{why}; " if c.get("unusable") else ""
            shared = f"{c['shared']} rows dropped for sharing a prompt with the find split; " if c.get("shared") else ""
            said.append(f"{part} pairs, {c.get('source', '?')}: {shared}{unusable}{made}{kept} of {pairs} pass "
                        f"({pairs - kept} dropped: {c.get('clean_missed', 0)} missed on the clean prompt, "
                        f"{c.get('cf_missed', 0)} on the counterfactual)")  # fmt: skip
            rows.append((part, str(c.get("source", "?")), count(drawn) if drawn else "n/a",
                         count(answered) if drawn else "n/a", count(pairs), count(c.get("clean_missed")),
                         count(c.get("cf_missed")), count(kept)))  # fmt: skip
    return (f"{n} {noun} in MIB's arithmetic format, kept where the model's top token is the answer on both "
            f"prompts ({'; '.join(said)})", rows)  # fmt: skip


def _pairs_label(meta: dict[str, Any], summary: list[dict[str, str]]) -> str:
    """"held-out" or "in-sample": from metadata, else cpr_cmd.csv; a folder that names neither is in-sample."""
    label = (meta.get("evaluation") or {}).get("pairs") or (summary[0].get("pairs") if summary else None)
    return str(label or IN_SAMPLE)


def _evaluation_sentence(meta: dict[str, Any], label: str) -> str:
    counts: dict[str, Any] = meta.get("counts", {})
    if label == IN_SAMPLE:
        return ("The circuits are evaluated IN-SAMPLE, on the same pairs their edges were scored on, so f, CPR and "
                "CMD say how well a circuit fits those pairs, not how well it generalises (MIB evaluates on a "
                "split the circuit was not found on).")  # fmt: skip
    test = (meta.get("evaluation") or {}).get("test") or "the test pairs"
    return (f"The circuits are evaluated on {counts.get('test_pairs', 'n/a')} held-out test pairs ({test}), which "
            "share no prompt (and, for the built-in prompts, no arithmetic fact) with the pairs the edges were "
            "scored on, as MIB finds circuits on its train split and evaluates them on validation.")  # fmt: skip


def _cell(row: dict[str, str], name: str, digits: int = 3) -> str:
    """CPR or CMD, with the spread over seeds for the random ranking."""
    if not row.get("seeds"):
        return fixed(value(row[name]), digits)
    sd = fixed(value(row.get(f"{name}_sd")), digits)
    return f"{fixed(value(row[name]), digits)} ± {sd} ({len(row['seeds'].split())} seeds)"


def _file_circuit(stage: StageFolder, label: str) -> str:
    if not stage.has("file_circuit.csv"):
        return ""
    row = stage.csv("file_circuit.csv")[0]
    return (f"The circuit file {row['source']} marks a circuit of {count(value(row['edges']))} edges "
            f"({num(value(row['percent']))} % of them); on {row['prompts']} {row.get('pairs', label)} pairs it keeps "
            f"f = {fixed(value(row['f']), 3)} (m = {num(value(row['m']))}, whole model {num(value(row['m_full']))}, "
            f"every edge ablated {num(value(row['m_empty']))}).")  # fmt: skip


def circuit_body(stage: StageFolder) -> Body:
    meta = stage.metadata
    config: dict[str, Any] = meta.get("config", {})
    graph: dict[str, Any] = meta.get("graph", {})
    counts: dict[str, Any] = meta.get("counts", {})
    method = str(config.get("method", "n/a"))
    prompts, filter_rows = _prompt_sentence(meta)
    summary = stage.csv("cpr_cmd.csv") if stage.has("cpr_cmd.csv") else []
    label = _pairs_label(meta, summary)
    edges = (f"Edges of MIB's graph ({count(graph.get('n_edges'))} edges: input, {graph.get('n_layers', '?')} layers "
             f"of {graph.get('n_heads', '?')} heads and an MLP, logits)")  # fmt: skip
    scored = (f"{edges}, scored by a circuit file made elsewhere ({config.get('circuit_file')})." if method == "file"
              else f"{edges} ranked by {METHOD_NAMES.get(method, method)} on {prompts}.")  # fmt: skip
    text = [scored, _evaluation_sentence(meta, label), _file_circuit(stage, label)]
    figures, tables = [], []
    if summary:
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
            seeds = f" (mean over seeds {row['seeds']})" if row.get("seeds") else ""
            described.append(f"{METHOD_NAMES.get(name, name)}{seeds} CPR {_cell(row, 'cpr', 2)}, CMD "
                             f"{_cell(row, 'cmd', 2)}, smallest circuit with f >= {GOOD_F:g}: {size}")  # fmt: skip
            table_rows.append((name, row.get("pairs", label), _cell(row, "cpr"), _cell(row, "cmd"),
                               num(value(smallest["percent"])) if smallest else "n/a",
                               count(value(smallest["edges"])) if smallest else "n/a"))  # fmt: skip
        text.append(
            f"Over the swept sizes, on the {label} pairs: {listing(described)}. CPR is the area under f with edges "
            "ranked by signed score (higher is better: a circuit that keeps the behaviour with few edges); CMD the "
            "area of |1 - f| with edges ranked by |score| (lower is better: close to the model at every size)."
        )
        above = sorted({r["method"] for r in rows if r["ranking"] == "signed" and _curve(r)
                        and value(r["f"]) > 1 + ABOVE_ONE})  # fmt: skip
        if above:
            text.append(f"f above 1 ({listing([METHOD_NAMES.get(m, m) for m in above])}) means a circuit pushes the "
                        "answer harder than the whole model: the edges it leaves out include ones that work against "
                        "the answer (negative scores), so CPR can exceed 1.")  # fmt: skip
        best = max(summary, key=lambda r: value(r["cpr"]))
        if len(summary) > 1:
            text.append(f"The highest CPR here is {METHOD_NAMES.get(best['method'], best['method'])}'s.")
        n_eval = first.get("prompts", counts.get("test_pairs", "n/a"))
        tables.append(Table(f"Faithfulness summary ({n_eval} {label} pairs; MIB's CPR over the signed ranking and "
                            "CMD over the |score| ranking; random: mean ± sd over seeds)",
                            ("ranking", "pairs", "CPR (signed ranking)", "CMD (|score| ranking)",
                             f"smallest f >= {GOOD_F:g} (% of edges)", "its edges"), table_rows))  # fmt: skip
        swept = [(r["method"], r.get("pairs", label), r["ranking"], r.get("draw", "") or "-", num(value(r["percent"])),
                  count(value(r["edges"])), fixed(value(r["f"]), 3)) for r in rows]  # fmt: skip
        tables.append(Table("f of each swept circuit (faithfulness.csv; random: the mean over seeds and each seed)",
                            ("ranking", "pairs", "ranked by", "draw", "% of edges", "edges", "f"), swept,
                            collapsed=True))  # fmt: skip
        if stage.has("faithfulness.png"):
            figures.append(Figure(stage.folder / "faithfulness.png",
                                  f"Faithfulness f of the top-k % circuits on the {label} pairs, one curve per "
                                  "ranking: ranked by signed score (left, CPR) and by |score| (right, "
                                  "CMD)."))  # fmt: skip
    elif method != "file":
        text.append("The faithfulness sweep was not run (evaluate off), so there is no CPR or CMD.")
    if filter_rows:
        tables.append(Table("Prompts: the answer filter (a pair is kept only where the model's top token is the answer "
                            "on both of its prompts), for the find and the test pairs",
                            ("pairs", "source", "single prompts drawn", "answered", "pairs checked", "missed clean",
                             "missed counterfactual", "kept"), filter_rows))  # fmt: skip
    oracle = meta.get("oracle")
    if isinstance(oracle, dict):
        text.append(f"Exact scores of {oracle.get('edges', 'n/a')} sampled edges (on the find pairs) agree with "
                    f"{method}'s by Spearman {fixed(oracle.get('spearman'))}, top-n overlap "
                    f"{pct(oracle.get('top_n_overlap'))}.")  # fmt: skip
    drawings = []
    if stage.has("circuit.svg"):
        why = (meta.get("drawing") or {}).get("why", "")
        drawings.append(read_drawing(stage.folder / "circuit.svg",
                                     f"The circuit drawn ({why}): blue edges have positive scores, vermillion "
                                     "negative; solid, dashed and dotted edges enter a head's query, key and value; "
                                     "hover an edge for its name and score."))  # fmt: skip
    small = small_samples({"find": counts.get("find_pairs", counts.get("prompts")), "test": counts.get("test_pairs")},
                          "prompt pair")
    return Body(" ".join(t for t in text if t), figures, tables, small, drawings)
