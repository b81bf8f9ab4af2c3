"""Report sections of the circuit-finding stages: identify, transfer, attention roles, MLP logit lens (knockout:
`knockout_section.py`).

Each builder reads one finished stage folder (the files its stage module documents) and returns a `Body`:
the stage's figures, a compact table of the numbers behind them, and a one-paragraph reading written from
those numbers. Nothing is recomputed and no model is loaded; a number a file does not hold is printed "n/a".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from arithmech.report.answer_digits_section import attention_places, identify_places
from arithmech.report.page import (
    Body,
    Figure,
    Table,
    fixed,
    is_number,
    listing,
    pct,
    signed_pct,
    small_samples,
    to_float,
)
from arithmech.report.run_folder import StageFolder

SOURCES = {"key_heads": "the identify run's key heads", "top_k": "the top heads by effect", "config": "heads asked for"}


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _effect_rows(rows: Sequence[dict[str, str]], kind: str, top: int) -> list[dict[str, str]]:
    chosen = [r for r in rows if r["kind"] == kind]
    return sorted(chosen, key=lambda r: to_float(r["effect"]))[:top]


def identify_body(stage: StageFolder) -> Body:
    meta = stage.metadata
    rows = stage.csv("effects.csv")
    key = stage.json("key_components.json")
    counts: dict[str, Any] = meta.get("counts", {})
    variant = meta.get("config", {}).get("variant", "path")
    heads, mlps = _effect_rows(rows, "head", 10), _effect_rows(rows, "mlp", 10)
    n_heads = sum(r["kind"] == "head" for r in rows)
    n_mlps = len(rows) - n_heads
    total = to_float(str(key.get("total_effect", meta.get("total_effect", ""))))
    text = [
        f"Path patching ({variant} variant) of {n_heads} heads and {n_mlps} MLPs at the last token, on "
        f"{counts.get('used', 'n/a')} reference prompts."
    ]
    if "pairs" in counts:
        text.append(
            f"The model answered {counts.get('answered_correctly', 'n/a')} of the {counts['pairs']} generated "
            f"prompt pairs; {counts.get('rejected_length_mismatch', 0)} were rejected for a counterfactual of "
            "another token length."
        )
    text.append(f"Replacing the whole prompt by its counterfactual moves the answer logit by {signed_pct(total)}.")
    strongest = [f"{kind} is {chosen[0]['component']} ({signed_pct(to_float(chosen[0]['effect']))})"
                 for kind, chosen in (("head", heads), ("MLP", mlps)) if chosen]  # fmt: skip
    if strongest:
        text.append("The strongest " + " and the strongest ".join(strongest) + ".")
    names = [item["component"] for item in key.get("key", [])]
    text.append(f"{plural(len(names), 'component')} pass the key rule ({key.get('rule', 'n/a')}): {listing(names)}.")
    if stage.has("agreement.json"):
        agree = stage.json("agreement.json")
        text.append(
            f"Attribution patching ranks the components with Spearman {fixed(agree.get('spearman_all'))} against "
            f"the exact scan (heads {fixed(agree.get('spearman_heads'))}, MLPs {fixed(agree.get('spearman_mlps'))}; "
            f"top-10 overlap {pct(agree.get('top10_overlap'))})."
        )
    header = ("rank", "component", "effect", "sd over prompts", "share of whole-prompt effect")

    def table_rows(chosen: list[dict[str, str]]) -> list[tuple[str, ...]]:
        return [
            (str(i + 1), r["component"], signed_pct(to_float(r["effect"])), pct(to_float(r["effect_std"]), 1),
             pct(to_float(r["fraction_of_total"])))
            for i, r in enumerate(chosen)
        ]  # fmt: skip

    tables = [
        Table(f"Top {len(heads)} heads by path-patching effect", header, table_rows(heads)),
        Table(f"Top {len(mlps)} MLPs by path-patching effect", header, table_rows(mlps)),
    ]
    if stage.has("template_accuracy.csv"):
        acc = stage.csv("template_accuracy.csv")
        tables.append(Table(
            "Accuracy per template (reference prompts answered before patching)",
            ("template", "pairs", "rejected", "kept", "correct", "accuracy"),
            [(r["template_id"], r["pairs"], r["rejected_length_mismatch"], r["kept"], r["correct"],
              pct(to_float(r["accuracy"]))) for r in acc],
            collapsed=True,
        ))  # fmt: skip
    figures = []
    if stage.has("effects_heatmap.png"):
        figures.append(Figure(stage.folder / "effects_heatmap.png",
                              "Path-patching effect of every head (layer x head) and MLP on the answer logit; "
                              "negative = the component carries the operation (paper Figure 2)."))  # fmt: skip
    reading = " ".join(text)
    if stage.has("effects_by_place.csv"):
        extra, place_figures, place_tables = identify_places(stage)
        reading += " " + extra
        figures += place_figures
        tables[2:2] = place_tables
    return Body(reading, figures, tables, small_samples({"": counts.get("used")}, "reference prompt"))


def transfer_body(stage: StageFolder) -> Body:
    rows = stage.csv("transfer.csv")
    word = "components" if stage.metadata.get("config", {}).get("include_mlps") else "heads"
    text = []
    why = {s.get("path"): s.get("why") for s in stage.metadata.get("sources", []) if isinstance(s, dict)}
    for source in dict.fromkeys(r["source"] for r in rows):
        mine = [r for r in rows if r["source"] == source]
        label, k = mine[0]["source_set"], mine[0]["k"]
        if why.get(source):
            text.append(f"From {label}, transfer knocks out {why[source]}.")
        scored = [r for r in mine if is_number(to_float(r["effect_drop"]))]
        empty = [r["target"] for r in mine if r not in scored]
        if not scored:
            text.append(f"No target set had answered prompts for the {k} {word} of {label}, so no drop is defined.")
            continue
        hi = max(scored, key=lambda r: to_float(r["effect_drop"]))
        lo = min(scored, key=lambda r: to_float(r["effect_drop"]))
        random_drops = [to_float(r["random_drop"]) for r in scored if is_number(to_float(r["random_drop"]))]
        text.append(
            f"Knocking out the {k} {word} of {label} ({listing(mine[0]['components'].split())}) costs "
            f"{pct(to_float(lo['effect_drop']))} to {pct(to_float(hi['effect_drop']))} of the answered prompts on "
            f"{plural(len(scored), 'target set')} (most on {hi['target']}, least on {lo['target']}); {k} random "
            f"{word} cost {pct(statistics.fmean(random_drops)) if random_drops else 'n/a'} on average."
        )
        if empty:
            text.append(f"No prompt was answered on {listing(empty)}, so the drop there is undefined.")
    replaced = [f"{r['target']} ({r['replaced_in_sample']} from {r['source_set']})" for r in rows
                if int(r.get("replaced_in_sample") or 0) > 0]  # fmt: skip
    if replaced:
        text.append(f"Held out: prompts that stated a fact a source was ranked on were replaced by prompts of other "
                    f"facts on {listing(replaced)}, so no cell is scored on the prompts its components were chosen "
                    "on.")  # fmt: skip
    table = Table(
        "Accuracy drop on each target set (share of the answered prompts lost)",
        ("source", "target", "answered", "prompts used", "effect-rank drop", "random drop (mean)", "note"),
        [(r["source_set"], r["target"], pct(to_float(r["base_accuracy"])), r["n_prompts"],
          pct(to_float(r["effect_drop"])), pct(to_float(r["random_drop"])), r.get("note", "")) for r in rows],
    )  # fmt: skip
    caption = ("Relative accuracy drop per source x target set: effect-rank knockout (left) and the random-rank "
               "control (right); grey = no answered prompts.")  # fmt: skip
    figures = [Figure(stage.folder / "transfer.png", caption)] if stage.has("transfer.png") else []
    small = small_samples({r["target"]: r["n_prompts"] for r in rows}, "answered prompt")
    return Body(" ".join(text), figures, [table], small)


def attention_body(stage: StageFolder) -> Body:
    meta = stage.metadata
    rows = stage.csv("attention_roles.csv")
    tau = meta.get("config", {}).get("tau", "n/a")
    source = str(meta.get("heads_source", "chosen heads"))
    by_label = {label: [r["head"] for r in rows if r["label"] == label] for label in ("operand", "operator", "neither")}
    text = (
        f"END-row attention of {plural(len(rows), 'head')} ({SOURCES.get(source, source)}), averaged "
        f"over {meta.get('counts', {}).get('prompts', 'n/a')} reference prompts: "
        f"{plural(len(by_label['operand']), 'operand head')} ({listing(by_label['operand'])}), "
        f"{plural(len(by_label['operator']), 'operator head')} ({listing(by_label['operator'])}) and "
        f"{len(by_label['neither'])} neither (tau = {tau})."
    )
    if rows:
        r = rows[0]
        text += (
            f" The first head, {r['head']}, puts {pct(to_float(r['operand']))} of its END attention on the operands "
            f"(A {pct(to_float(r['A']))}, B {pct(to_float(r['B']))}), {pct(to_float(r['operator']))} on the "
            f"operator and {pct(to_float(r['prefix']))} on the solved examples."
        )
    table = Table(
        "Share of END attention by token role",
        ("head", "A", "B", "operator", "prefix", "other", "A+B", "label"),
        [(r["head"], *(f"{to_float(r[c]):.2f}" for c in ("A", "B", "operator", "prefix", "other", "operand")),
          r["label"]) for r in rows],
    )  # fmt: skip
    figures = []
    if stage.has("attention_roles.png"):
        figures.append(Figure(stage.folder / "attention_roles.png",
                              "Share of each head's END attention on operand A, operand B, the operator, the "
                              "few-shot prefix and other tokens (paper Figure 5)."))  # fmt: skip
    if stage.has("attention_examples.png"):
        figures.append(
            Figure(
                stage.folder / "attention_examples.png",
                "END attention of the heads over the tokens of single prompts (paper Figure 7).",
            )
        )
    tables = [table]
    if stage.has("attention_by_place.csv"):
        extra, place_table = attention_places(stage)
        text += extra
        tables.append(place_table)
    return Body(text, figures, tables, small_samples({"": meta.get("counts", {}).get("prompts")}, "reference prompt"))


def mlp_body(stage: StageFolder) -> Body:
    meta = stage.metadata
    rows = stage.csv("mlp_cosines.csv")
    value = {(int(r["layer"]), c): to_float(r[c]) for r in rows for c in r if c != "layer"}
    layers = [int(r["layer"]) for r in rows]

    def advantage(layer: int, name: str) -> float:
        return value[(layer, name)] - value[(layer, f"{name}_wrong")]

    ranked = sorted((la for la in layers if is_number(advantage(la, "cos_update_C"))),
                    key=lambda la: -advantage(la, "cos_update_C"))  # fmt: skip
    pointing = [la for la in ranked if advantage(la, "cos_update_C") > 0][:3]
    reading_in = [la for la in layers if advantage(la, "cos_in_A") > 0 and advantage(la, "cos_in_B") > 0]
    example: dict[str, Any] = meta.get("example", {})
    answer_id = example.get("token_ids", {}).get("C")
    ranks: dict[int, dict[str, str]] = {}  # layer -> the answer token's row of the example prompt
    if stage.has("mlp_update_ranks.csv") and answer_id is not None:
        ranks = {int(r["layer"]): r for r in stage.csv("mlp_update_ranks.csv") if int(r["token_id"]) == answer_id}
    text = f"Over {meta.get('counts', {}).get('prompts', 'n/a')} reference prompts, "
    if pointing:
        text += "the MLP update points at the answer more than at other numbers most in "
        text += "layer " if len(pointing) == 1 else "layers "
        text += listing([f"{la} (cos C - others {advantage(la, 'cos_update_C'):+.3f})" for la in pointing])
    else:
        text += "no layer's MLP update points at the answer more than at the other numbers"
    text += "; the MLP input aligns with both operands more than with other numbers in "
    text += plural(len(reading_in), "layer")
    text += f" ({listing([str(la) for la in reading_in], 12)})." if reading_in else "."
    first = [la for la, r in sorted(ranks.items()) if int(r["rank_among_numbers"]) == 0]
    if first:
        text += (
            f" In the example prompt (answer {example.get('answer', '?')}), the update ranks the answer first among "
            f"the numbers in {plural(len(first), 'layer')} ({listing([str(la) for la in first], 12)})."
        )
    elif ranks:
        best = min(ranks, key=lambda la: int(ranks[la]["rank_among_numbers"]))
        text += (
            f" In the example prompt (answer {example.get('answer', '?')}), no layer's update ranks the answer first "
            f"among the numbers; best is layer {best} (rank {int(ranks[best]['rank_among_numbers']) + 1})."
        )
    header = ("layer", "cos(in, A) - others", "cos(in, B) - others", "cos(update, C)", "cos(update, C) - others",
              "example: answer's rank among numbers (vocabulary)")  # fmt: skip

    def row(la: int) -> tuple[str, ...]:
        rank = ranks.get(la)
        where = f"{int(rank['rank_among_numbers']) + 1} ({int(rank['rank']) + 1})" if rank else "n/a"
        return (str(la), f"{advantage(la, 'cos_in_A'):+.3f}", f"{advantage(la, 'cos_in_B'):+.3f}",
                f"{value[(la, 'cos_update_C')]:+.3f}", f"{advantage(la, 'cos_update_C'):+.3f}", where)  # fmt: skip

    tables = [Table("Layers whose MLP update points at the answer most (ranks 1 = top)", header,
                    [row(la) for la in ranked[:5]])]  # fmt: skip
    tables.append(Table("Every layer", header, [row(la) for la in layers], collapsed=True))
    figures = []
    if stage.has("mlp_cosines.png"):
        figures.append(Figure(stage.folder / "mlp_cosines.png",
                              "Cosine of the MLP input with the operands' unembeddings and of the MLP update with "
                              "the answer's, against other numbers, per layer (paper Figure 6a/b)."))  # fmt: skip
    if stage.has("mlp_update_ranks.png"):
        figures.append(Figure(stage.folder / "mlp_update_ranks.png",
                              "Rank of every number token in the logits of each layer's MLP update, one prompt "
                              "(paper Figure 6c)."))  # fmt: skip
    return Body(text, figures, tables, small_samples({"": meta.get("counts", {}).get("prompts")}, "reference prompt"))
