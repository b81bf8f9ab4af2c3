"""Report sections of the mechanism and improvement stages: mediation, method agreement, neurons, finetune,
evaluate. Same contract as `report/sections.py`: read one finished stage folder, return figures, a compact
table and a reading written from the numbers; nothing is recomputed.
"""

from __future__ import annotations

import statistics
from typing import Any

from arithmech.report.arithmetic_section import arithmetic_part
from arithmech.report.page import (
    Body,
    Figure,
    Table,
    count,
    fixed,
    is_number,
    listing,
    num,
    pct,
    small_samples,
    to_float,
)
from arithmech.report.run_folder import StageFolder
from arithmech.report.sections import plural

COMPONENT_NAMES = {"mlp": "MLP", "attn": "attention"}


def _peak(rows: list[dict[str, str]], task: str, component: str, where: str | None = None) -> dict[str, str] | None:
    """The (layer, class) cell of one task and component with the largest median indirect effect (at position
    class `where` only, when given)."""
    cells = [r for r in rows if r["task"] == task and r["component"] == component and where in (None, r["class"])]
    cells = [r for r in cells if is_number(to_float(r["median_ie"]))]
    return max(cells, key=lambda r: to_float(r["median_ie"])) if cells else None


def mediation_body(stage: StageFolder) -> Body:
    rows = stage.csv("mediation_by_class.csv")
    totals = {r["task"]: r for r in stage.csv("mediation_total.csv")}
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    components = list(dict.fromkeys(r["component"] for r in rows))
    text, table_rows = [], []
    for task in tasks:
        peaks = {c: _peak(rows, task, c) for c in components}
        described = [
            f"the {COMPONENT_NAMES.get(c, c)} of layer {p['layer']} at the {p['class']} position "
            f"(median IE {num(to_float(p['median_ie']))}, mean {num(to_float(p['mean_ie']))})"
            for c, p in peaks.items() if p is not None
        ]  # fmt: skip
        text.append(f"For {task} the largest median indirect effects are {listing(described)}.")
        last = _peak(rows, task, "mlp", "last")  # where the result is written (Stolfo et al.), if not the peak
        if last is not None and peaks.get("mlp") is not None and peaks["mlp"]["class"] != "last":
            text.append(f"At the last token the MLP of layer {last['layer']} has the largest "
                        f"(median IE {num(to_float(last['median_ie']))}).")  # fmt: skip
        total = totals.get(task, {})
        table_rows.append((
            task, total.get("pairs", "n/a"), num(to_float(total.get("mean_te"))), num(to_float(total.get("median_te"))),
            pct(to_float(total.get("number_accuracy"))),
            *(f"layer {p['layer']}, {p['class']}: {num(to_float(p['median_ie']))}" if p else "n/a"
              for p in peaks.values()),
        ))  # fmt: skip
    tables = [Table(
        "Per task: pairs, total effect, number accuracy and the peak median indirect effect per component",
        ("task", "pairs", "mean TE", "median TE", "number accuracy", *(f"{COMPONENT_NAMES.get(c, c)} peak"
                                                                       for c in components)),
        table_rows,
    )]  # fmt: skip
    if stage.has("neuron_overlap.csv"):
        overlap = stage.csv("neuron_overlap.csv")
        if overlap:
            value = {(r["task_a"], r["task_b"]): to_float(r["overlap"]) for r in overlap}
            names = list(dict.fromkeys(r["task_a"] for r in overlap))
            layer, k = overlap[0]["layer"], overlap[0]["k"]
            others = [f"{pct(value.get((names[0], b)))} with {b}" for b in names[1:]]
            text.append(f"The top-{k} neurons of the layer-{layer} MLP of {names[0]} overlap {listing(others)}.")
            tables.append(Table(
                f"Overlap of the top-{k} neurons (layer {layer} MLP, by indirect effect at the last token)",
                ("task", *names), [(a, *(pct(value.get((a, b))) for b in names)) for a in names],
            ))  # fmt: skip
    figures = [
        Figure(stage.folder / f"mediation_{s}.png",
               f"{s.capitalize()} indirect effect over pairs by layer (y) and position class (x), MLP and "
               "attention rows, one column per task; red = the component carries the result.")
        for s in ("mean", "median") if stage.has(f"mediation_{s}.png")
    ]  # fmt: skip
    return Body(" ".join(text), figures, tables, small_samples({t: r.get("pairs") for t, r in totals.items()}, "pair"))


def agreement_body(stage: StageFolder) -> Body:
    rows = stage.csv("agreement.csv")
    counts: dict[str, Any] = stage.metadata.get("counts", {})
    prompts = counts.get("prompts", "n/a")
    text = [f"Every pair of methods scored on the same {prompts} prompts."]
    for level in dict.fromkeys(r["level"] for r in rows):
        mine = [r for r in rows if r["level"] == level and is_number(to_float(r["spearman"]))]
        if not mine:
            continue
        hi = max(mine, key=lambda r: to_float(r["spearman"]))
        lo = min(mine, key=lambda r: to_float(r["spearman"]))
        sites = int(to_float(hi["n_sites"])) if is_number(to_float(hi["n_sites"])) else "n/a"
        sentence = (
            f"{level.capitalize()}s ({sites} sites): {hi['method_a']} vs {hi['method_b']} agree with "
            f"Spearman {fixed(to_float(hi['spearman']))} (top-5 overlap {pct(to_float(hi['top5_overlap']))})"
        )
        if lo is not hi:
            sentence += f", least {lo['method_a']} vs {lo['method_b']} ({fixed(to_float(lo['spearman']))})"
        text.append(sentence + ".")
    table = Table(
        "Spearman correlation and top-k overlap of each pair of methods",
        ("level", "method a", "method b", "sites", "Spearman", "top-5", "top-10", "top-20"),
        [(r["level"], r["method_a"], r["method_b"], count(to_float(r["n_sites"])), fixed(to_float(r["spearman"])),
          pct(to_float(r["top5_overlap"])), pct(to_float(r["top10_overlap"])), pct(to_float(r["top20_overlap"])))
         for r in rows],
    )  # fmt: skip
    figures = [Figure(stage.folder / "agreement.png",
                      "Spearman correlation (and top-10 overlap) between the methods' component rankings, per "
                      "level.")] if stage.has("agreement.png") else []  # fmt: skip
    small = small_samples({"": prompts}, "prompt") + small_samples({"mediation": counts.get("mediation_pairs")}, "pair")
    return Body(" ".join(text), figures, [table], small)


def _tokens(text: str, n: int = 6) -> str:
    return " | ".join(text.split(" | ")[:n])


def neurons_body(stage: StageFolder) -> Body:
    meta = stage.metadata
    cfg: dict[str, Any] = meta.get("config", {})
    spec = stage.json("specialisation.json")
    drops = {(r["operation"], r["component"]): to_float(r["prob_drop"]) for r in stage.csv("head_importance.csv")}
    ops = list(spec.get("top", {}))
    shares = [f"{pct(spec['share_of_drop'].get(op))} for {op} ({listing(spec['top'][op])})" for op in ops]
    text = [f"Zeroing each head in turn, the top heads carry {listing(shares)} of the summed drop in P(answer)."]
    only = [f"{op}: {listing(spec.get('only_this_operation', {}).get(op, []))}" for op in ops]
    text.append(f"Heads among the top of every operation: {listing(spec.get('shared_by_all', []))}; of only one: "
                f"{'; '.join(only)}.")  # fmt: skip
    tables = [Table(
        "Heads that matter per operation (drop of P(answer) when zeroed)",
        ("operation", "base accuracy", "top heads (drop)", "share of summed drop", "only this operation"),
        [(op, pct(spec.get("base_accuracy", {}).get(op)),
          ", ".join(f"{h} ({num(drops.get((op, h)))})" for h in spec["top"][op]),
          pct(spec.get("share_of_drop", {}).get(op)), listing(spec.get("only_this_operation", {}).get(op, [])))
         for op in ops],
    )]  # fmt: skip
    cna = stage.csv("cna_neurons.csv") if stage.has("cna_neurons.csv") else []
    if cna:
        top = cna[0]
        deep = [str(la) for la in meta.get("layers", [])]
        layers = ("layer " if len(deep) == 1 else "layers ") + listing(deep)
        text.append(
            f"For head {meta.get('head', 'n/a')} the neuron with the largest CNA in {layers} is "
            f"{top['neuron']} (CNA {num(to_float(top['cna']))}; LI {num(to_float(top['li_intact']))} intact vs "
            f"{num(to_float(top['li_zeroed']))} with the head zeroed), whose value vector promotes "
            f"{_tokens(top['promoted_tokens'], 5)}."
        )
        tables.append(Table(
            f"Top {len(cna)} neurons by comparative neuron analysis (head {meta.get('head', 'n/a')} zeroed)",
            ("rank", "neuron", "CNA", "LI intact", "LI head zeroed", "promoted tokens"),
            [(r["rank"], r["neuron"], num(to_float(r["cna"])), num(to_float(r["li_intact"])),
              num(to_float(r["li_zeroed"])), _tokens(r["promoted_tokens"])) for r in cna[:10]],
        ))  # fmt: skip
    pruning = stage.csv("pruning.csv") if stage.has("pruning.csv") else []
    scored_on = "held-out" if any(r.get("prompts") == "held-out" for r in pruning) else None
    kept = [r for r in pruning if int(r["n_kept"]) > 0 and r.get("prompts", scored_on) == scored_on]
    if kept:
        r = kept[0]
        where = "on held-out prompts (not those that ranked the neurons) " if scored_on else ""
        text.append(
            f"Keeping only the {r['n_kept']} top-{str(cfg.get('prune_by', 'scored')).upper()} neurons of those "
            f"layers gives {where}"
            f"accuracy {pct(to_float(r['top_accuracy']))} (P(answer) {num(to_float(r['top_prob']))}) vs "
            f"{pct(to_float(r['random_accuracy_mean']))} ± {pct(to_float(r['random_accuracy_sd']))} "
            f"(P {num(to_float(r['random_prob_mean']))}) for random ones; nothing pruned: "
            f"{pct(to_float(r['baseline_accuracy']))} (P {num(to_float(r['baseline_prob']))})."
        )
    if pruning:
        tables.append(Table(
            "Pruning: accuracy with only the top-scored or random neurons kept",
            ("prompts", "neurons kept", "share kept", "top accuracy", "top P(answer)", "random accuracy (mean ± sd)",
             "random P(answer)", "nothing pruned"),
            [(r.get("prompts", "ranking"), r["n_kept"], pct(to_float(r["fraction_kept"]), 1),
              pct(to_float(r["top_accuracy"])),
              num(to_float(r["top_prob"])),
              f"{pct(to_float(r['random_accuracy_mean']))} ± {pct(to_float(r['random_accuracy_sd']))}",
              num(to_float(r["random_prob_mean"])), pct(to_float(r["baseline_accuracy"]))) for r in pruning],
        ))  # fmt: skip
    lora = stage.csv("lora_coefficients.csv") if stage.has("lora_coefficients.csv") else []
    ratios = [to_float(r["coef_ratio"]) for r in lora if is_number(to_float(r["coef_ratio"]))]
    if ratios:
        info: dict[str, Any] = meta.get("lora", {})
        text.append(
            f"LoRA on layer {info.get('trained_layer', 'n/a')} (rank {info.get('rank', 'n/a')}, "
            f"{info.get('steps', 'n/a')} steps, loss {num(info.get('loss_first'))} to {num(info.get('loss_last'))}) "
            f"scales the top neurons' coefficients by a median factor of {num(statistics.median(ratios))}."
        )
        tables.append(Table(
            "Top neurons' coefficients before and after LoRA",
            ("neuron", "before", "after", "ratio", "LI change"),
            [(r["neuron"], num(to_float(r["coef_before"])), num(to_float(r["coef_after"])),
              num(to_float(r["coef_ratio"])), num(to_float(r["li_change"]))) for r in lora],
            collapsed=True,
        ))  # fmt: skip
    figures = []
    if stage.has("head_importance.png"):
        figures.append(
            Figure(
                stage.folder / "head_importance.png",
                "Drop of P(answer) when each head is zeroed, one layer x head panel per operation.",
            )
        )
    if stage.has("pruning.png"):
        figures.append(Figure(stage.folder / "pruning.png",
                              "Accuracy with only the top-scored neurons of the deep layers kept vs as many random "
                              "ones (mean ± sd)."))  # fmt: skip
    counts: dict[str, Any] = meta.get("counts", {})
    prompts = counts.get("prompts")  # per operation
    small = small_samples(prompts if isinstance(prompts, dict) else {"": prompts}, "prompt")
    small += small_samples({f"pruning ({k})": v for k, v in counts.get("pruning_prompts", {}).items()}, "prompt")
    return Body(" ".join(text), figures, tables, small)


def finetune_body(stage: StageFolder) -> Body:
    meta = stage.metadata
    selection: dict[str, Any] = meta.get("selection", {})
    method = meta.get("method", meta.get("config", {}).get("method", "n/a"))
    log = stage.csv("train_log.csv") if stage.has("train_log.csv") else []
    losses = [to_float(r["loss"]) for r in log]
    what = {"precise": "Precise SFT", "full": "Full SFT", "lora": "LoRA"}.get(method, str(method))
    heads, mlps = selection.get("heads", []), selection.get("mlps", [])
    trained = f" of heads {listing(heads)}" + (f" and MLPs {listing(mlps)}" if mlps else "") if heads or mlps else ""
    trainable, total = meta.get("trainable_parameters"), meta.get("total_parameters")
    steps = meta.get("counts", {}).get("steps", len(log))
    text = (
        f"{what}{trained} trained {count(trainable)} of {count(total)} parameters "
        f"({pct(meta.get('trainable_fraction'), 2)}) for {plural(int(steps), 'step')} at "
        f"{num(meta.get('samples_per_second'))} samples/s"
    )
    data: dict[str, Any] = meta.get("data", {})
    if data.get("operations"):  # `data: arithmetic`: the train part of the template split
        text += (f" on {data.get('kept', 'n/a')} arithmetic prompts ({listing(data['operations'])}; train templates "
                 f"and operand pairs of split {data.get('split_fingerprint', 'n/a')})")  # fmt: skip
    text += f"; loss {num(losses[0])} at the first step, {num(losses[-1])} at the last." if losses else "."
    memory: dict[str, Any] = meta.get("peak_memory", {})
    rows = [
        ("method", str(method)), ("heads trained", listing(heads, 20)), ("MLPs trained", listing(mlps, 20)),
        ("trainable parameters", count(trainable)), ("total parameters", count(total)),
        ("trainable share", pct(meta.get("trainable_fraction"), 3)), ("steps", str(steps)),
        ("examples per step", str(meta.get("counts", {}).get("examples_per_step", "n/a"))),
        ("samples per second", num(meta.get("samples_per_second"))), ("final loss", num(meta.get("final_loss"))),
        ("peak memory", f"{num(memory.get('bytes', float('nan')) / 2**20, 4)} MiB ({memory.get('kind', 'n/a')})"),
        ("training data", f"{data.get('path', 'n/a')} ({data.get('kept', 'n/a')} rows kept)"),
    ]  # fmt: skip
    return Body(text, [], [Table("Fine-tuning run", ("setting", "value"), rows)])


def _results(stage: StageFolder, which: str) -> dict[str, dict[str, str]]:
    sub = stage.folder / which
    path = sub / "results.csv" if (sub / "metadata.json").is_file() else None
    if which == "base" and path is None and stage.has("results.csv"):  # `arithmech evaluate --out <run>/evaluate`
        path = stage.folder / "results.csv"
    if path is None or not path.is_file():
        return {}
    return {r["benchmark"]: r for r in StageFolder(which, path.parent, "done").csv("results.csv")}


def evaluate_body(stage: StageFolder) -> Body:
    base, tuned = _results(stage, "base"), _results(stage, "tuned")
    names = list(dict.fromkeys([*base, *tuned]))
    text, rows = [], []
    arithmetic = arithmetic_part(stage, base, tuned)
    for name in names:
        b, t = base.get(name, {}), tuned.get(name, {})
        kind = (b or t).get("kind", "")
        if kind == "general":
            ppl_b, ppl_t, kl = (to_float(b.get("perplexity")), to_float(t.get("perplexity")), to_float(t.get("kl")))
            cells = (f"perplexity {num(ppl_b)}", f"perplexity {num(ppl_t)}" if t else "n/a",
                     f"KL {num(kl)}" if t else "n/a")  # fmt: skip
            if kind not in arithmetic.covers:
                text.append(f"{name}: perplexity {num(ppl_b)}"
                            + (f" base, {num(ppl_t)} tuned (KL to the base model {num(kl)})" if t else ""))  # fmt: skip
        else:
            acc_b, acc_t = to_float(b.get("accuracy")), to_float(t.get("accuracy"))
            change = f"{(acc_t - acc_b) * 100:+.1f} points" if is_number(acc_b) and is_number(acc_t) else "n/a"
            cells = (pct(acc_b, 1), pct(acc_t, 1) if t else "n/a", change)
            n = (b or t).get("n", "n/a")
            if kind not in arithmetic.covers:  # arithmetic: read out per operation by the arithmetic part
                tail = f" base, {pct(acc_t, 1)} tuned ({change})" if t else ""
                text.append(f"{name} (n={n}): {pct(acc_b, 1)}{tail}")
        rows.append((name, kind, (b or t).get("n", "n/a"), *cells))
    lead = "Base and tuned model" if tuned else "Base model"
    reading = f"{lead} on {plural(len(text), 'benchmark')}: " + "; ".join(text) + "." if text else ""
    reading = f"{arithmetic.reading} {reading}".strip() or "No benchmark results were written."
    table = Table("Benchmark results", ("benchmark", "kind", "n", "base", "tuned", "change"), rows)
    sizes = {name: (base.get(name) or tuned[name]).get("n") for name in names}
    return Body(reading, [], [*arithmetic.tables, table], small_samples(sizes, "row"))
