"""The files of experiments/arithmetic_sft.py: reading its run folders into the table, the figure and the estimate
(the comparisons' paired differences: arithmetic_sft_compare.py).

Only reads what the finetune and evaluate stages wrote (metadata.json, arithmetic.csv, results.csv); nothing is
recomputed, so `python experiments/arithmetic_sft.py` on a finished folder only rewrites table.md, table.csv and
arithmetic_sft.png.
"""

from __future__ import annotations

import csv
import json
import statistics
from argparse import Namespace
from pathlib import Path
from typing import Any

from arithmetic_sft_compare import degrees, paired_difference, points

from arithmech.data.arithmetic_split import TRANSFER_PER_TEMPLATE, make_split
from arithmech.data.templates import OPERATIONS, load_templates
from arithmech.evaluate.clustered_interval import Difference


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _arith(folder: Path) -> dict[tuple[str, str], dict[str, str]]:
    """(benchmark, operation) -> its all-formations row of an eval folder's arithmetic.csv."""
    rows = csv.DictReader((folder / "arithmetic.csv").open())
    return {(r["benchmark"], r["operation"]): r for r in rows if r["formation"] == "all"}


def sweep_score(folder: Path, ops: tuple[str, ...]) -> float:
    """Mean first-token accuracy over the training operations on the validation part."""
    rows = _arith(folder)
    return statistics.fmean(float(rows[f"arithmetic-{op}", op]["accuracy"]) for op in ops)


def lora_params_per_rank(dims: dict[str, int]) -> int:
    """LoRA on q, k, v, o of every layer adds r * (fan_in + fan_out) per projection (separate q/k/v projections)."""
    d, q, kv = dims["d_model"], dims["n_heads"] * dims["d_head"], dims["n_kv_heads"] * dims["d_head"]
    return dims["n_layers"] * ((d + q) + 2 * (d + kv) + (q + d))


def lora_rank(precise_folder: Path, identify_dir: Path) -> int:
    """The rank whose LoRA parameter count is closest to that precise SFT run's trainable parameters."""
    dims = read_json(identify_dir / "metadata.json")["dims"]
    target = read_json(precise_folder / "metadata.json")["trainable_parameters"]
    per_rank = lora_params_per_rank(dims)
    rank = max(1, round(target / per_rank))
    print(f"LoRA rank {rank}: {rank * per_rank:,} parameters ({per_rank:,} per rank) vs precise {target:,}")
    return rank


def _cell(row: dict[str, str] | None, key: str = "accuracy") -> str:
    if not row:
        return "n/a"
    low, high = ("exact_ci_low", "exact_ci_high") if key == "exact_accuracy" else ("ci_low", "ci_high")
    return f"{float(row[key]):.1%} [{float(row[low]):.0%}, {float(row[high]):.0%}]"


def row_record(name: str, folder: Path, a: Namespace) -> dict[str, Any]:
    """One table row: training facts, held-out accuracy per operation, transfer, general ability."""
    rec: dict[str, Any] = {"row": name}
    if name != "base":
        meta = read_json(folder / "metadata.json")
        memory = meta["peak_memory"]["bytes"] / 2**20
        rec.update(lr=meta["config"]["lr"], trainable_parameters=meta["trainable_parameters"],
                   samples_per_second=meta["samples_per_second"], peak_memory_mib=memory,
                   heads=",".join(meta["selection"].get("heads", [])))  # fmt: skip
    arith = _arith(folder / "eval-test")
    for op in OPERATIONS:
        row = arith.get(("arithmetic", op))
        rec.update({f"{op}": _cell(row), f"{op}_accuracy": row and float(row["accuracy"]),
                    f"{op}_ci": row and (float(row["ci_low"]), float(row["ci_high"]))})  # fmt: skip
    for op in a.ops:
        row = arith.get((f"arithmetic-multidigit-{op}", op))
        rec[f"multidigit-{op}"] = _cell(row, "exact_accuracy")
    general = read_json(folder / "eval-general" / "metadata.json")["benchmarks"]  # full precision (not the csv)
    for bench in ("mmlu", "csqa"):
        r = general.get(bench, {})
        rec[bench] = f"{r['correct']}/{r['n']}" if r else "n/a"
    info = general.get("general", {}).get("info", {})
    rec["perplexity"], rec["kl"] = info.get("perplexity"), info.get("kl") if name != "base" else None
    return rec


def _table(records: list[dict[str, Any]], a: Namespace) -> list[str]:
    cols = ["row", "lr", "trainable parameters", "samples/s", "peak memory (MiB)", *OPERATIONS,
            *(f"multi-digit {op} (exact)" for op in a.ops), "MMLU", "CSQA", "perplexity", "KL to base"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        cells = [r["row"], f"{r['lr']:g}" if "lr" in r else "-",
                 f"{r['trainable_parameters']:,}" if "lr" in r else "-",
                 f"{r['samples_per_second']:.2f}" if "lr" in r else "-",
                 f"{r['peak_memory_mib']:,.0f}" if "lr" in r else "-", *(r[op] for op in OPERATIONS),
                 *(r[f"multidigit-{op}"] for op in a.ops), r["mmlu"], r["csqa"],
                 f"{r['perplexity']:.2f}" if r["perplexity"] else "n/a",
                 f"{r['kl']:.2g}" if r["kl"] is not None else "-"]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


COMPARISONS_FILE = "comparisons.csv"
"""Every paired difference table.md states, one row each (the prose is rendered from these numbers)."""


def _comparison(name: str, op: str, k: int | str, side_a: list[str], side_b: list[str], diff: Difference,
                records: dict[str, dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """One comparison's row of comparisons.csv: both sides' seeds, accuracies and trainable parameters, and the
    difference with its interval and degrees of freedom."""
    rec: dict[str, Any] = {"comparison": name, "operation": op, "k": k}
    for side, names in (("a", side_a), ("b", side_b)):
        each = [records[n] for n in names]
        rec.update({f"rows_{side}": ";".join(names), f"seeds_{side}": len(names),
                    f"accuracy_{side}": statistics.fmean(r[f"{op}_accuracy"] for r in each),
                    f"trainable_parameters_{side}": ";".join(sorted({str(r.get("trainable_parameters", ""))
                                                                      for r in each}))})  # fmt: skip
    rec.update(difference=diff.mean, ci_low=diff.low, ci_high=diff.high, df=diff.df, cluster_df=diff.cluster_df,
               templates=diff.templates, facts=diff.facts)  # fmt: skip
    return rec


def comparisons(rows: dict[str, Path | None], records: list[dict[str, Any]], out: Path, a: Namespace) -> list[dict]:
    """The positive control (full SFT minus base) and effect-ranked minus random heads at each k, per training
    operation; both sides of a head comparison are means over the same seeds."""
    by_name = {r["row"]: r for r in records}
    found = []
    for op in a.ops:
        diff = paired_difference([_folder(rows, "full")], [out / "base"], op)
        found.append(_comparison("full - base", op, "", ["full"], ["base"], diff, by_name))
    for k in a.ks:
        top = [n for n in rows if n.startswith(f"precise-top{k}-seed")]
        rand = [n for n in rows if n.startswith(f"precise-random{k}-seed")]
        for op in a.ops:
            diff = paired_difference([_folder(rows, n) for n in top], [_folder(rows, n) for n in rand], op)
            found.append(_comparison("effect-ranked - random", op, k, top, rand, diff, by_name))
    return found


def _difference(c: dict[str, Any]) -> Difference:
    return Difference(c["difference"], c["ci_low"], c["ci_high"], c["df"], c["cluster_df"], c["templates"],
                      c["facts"])  # fmt: skip


def _matched(c: dict[str, Any]) -> bool:
    return ";" not in c["trainable_parameters_a"] and c["trainable_parameters_a"] == c["trainable_parameters_b"]


MATCHED = ("- effect-ranked minus random heads: paired per prompt, each side the mean over its seeds; 95% intervals "
           "are t on the Welch-Satterthwaite df of the template-and-fact clustered variance (min(templates, facts) - 1 "
           "df) and each side's seed-to-seed variance (seeds - 1 df). Each random-k seed draws its own k heads among "
           "the sets touching as many key/value groups as the top-k heads, ")  # fmt: skip
"""The sentence before the head comparisons; it ends with whether the rows are parameter-matched."""


def _comparison_lines(found: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[str]:
    """table.md's reading of comparisons.csv: the control's verdict, and per k the two sides, their difference with
    its interval and df, and their trainable parameters."""
    accuracy = {r["row"]: r for r in records}
    control, heads = [], []
    for c in found:
        diff, op = _difference(c), c["operation"]
        if c["comparison"] == "full - base":
            verdict = "above 0" if diff.low > 0 else "NOT above 0: the setup is too small, raise --steps"
            control.append(f"- positive control, {op}: full SFT minus base {points(diff)} ({degrees(diff)}): {verdict}")
            continue
        top, rand = c["rows_a"].split(";"), c["rows_b"].split(";")
        each = {n: accuracy[n][f"{op}_accuracy"] for n in [*top, *rand]}
        params = (f"{int(c['trainable_parameters_a']):,} both" if _matched(c) else
                  f"NOT matched: {c['trainable_parameters_a']} vs {c['trainable_parameters_b']}")  # fmt: skip
        heads.append(f"- k = {c['k']}, {op}: effect-ranked {c['accuracy_a']:.1%} vs random {c['accuracy_b']:.1%} "
                     f"(means over {len(top)} and {len(rand)} seeds: {_listed(each, top)} vs {_listed(each, rand)}); "
                     f"difference {points(diff)} ({degrees(diff, (len(top), len(rand)))}); trainable parameters "
                     f"{params}")  # fmt: skip
    if not heads:
        return control
    matched = all(_matched(c) for c in found if c["comparison"] != "full - base")
    ending = ("so the rows are parameter-matched: the same number of heads and of trainable parameters" if matched
              else "but these rows are NOT parameter-matched (made before the matched draw?): their difference is "
              "confounded with the number of parameters trained")  # fmt: skip
    return [*control, MATCHED + ending, *heads]


def _folder(rows: dict[str, Path | None], name: str) -> Path:
    folder = rows[name]
    assert folder is not None
    return folder


def _listed(values: dict[str, float], names: list[str]) -> str:
    return ", ".join(f"{values[n]:.1%}" for n in names)


def _related_facts(a: Namespace) -> list[str]:
    """Test problems whose fact the training trains in another operation (5 - 3 = 2 trained, 2 + 3 tested)."""
    counts = make_split(a.split_seed).related_fact_trained(tuple(a.ops))
    each = ", ".join(f"{op} {c['related']} of {c['test']}" for op, c in counts.items())
    return [f"- test problems whose fact ({', '.join(a.ops)} trained) is a train problem of another operation: "
            f"{each} (data/facts.py; none within an operation)"]  # fmt: skip


def write_outputs(out: Path, rows: dict[str, Path | None], a: Namespace) -> None:
    records = [row_record(name, folder or out / "base", a) for name, folder in rows.items()]
    keys = list(dict.fromkeys(k for r in records for k in r if not k.endswith("_ci")))
    with (out / "table.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
    found = comparisons(rows, records, out, a)
    with (out / COMPARISONS_FILE).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(found[0]))
        writer.writeheader()
        writer.writerows(found)
    text = [*_table(records, a), "", *_comparison_lines(found, records), *_related_facts(a)]
    (out / "table.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    figure(records, a, out / "arithmetic_sft.png")


def figure(records: list[dict[str, Any]], a: Namespace, path: Path) -> None:
    """Held-out accuracy on each training operation per row, with 95% intervals clustered by template and fact."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from arithmech.report.plots import save_figure
    from arithmech.report.style import styled

    @styled
    def draw() -> None:
        fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(records) + 2), 3.2), dpi=150)
        width = 0.8 / len(a.ops)
        for j, op in enumerate(a.ops):
            xs = [i + (j - (len(a.ops) - 1) / 2) * width for i in range(len(records))]
            ys = [r[f"{op}_accuracy"] * 100 for r in records]
            err = [[(r[f"{op}_accuracy"] - r[f"{op}_ci"][0]) * 100 for r in records],
                   [(r[f"{op}_ci"][1] - r[f"{op}_accuracy"]) * 100 for r in records]]  # fmt: skip
            ax.bar(xs, ys, width, yerr=err, capsize=2, label=f"{op} (held out)")
        ax.axhline(records[0][f"{a.ops[0]}_accuracy"] * 100, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(records)), [r["row"] for r in records], rotation=45, ha="right")
        ax.set_ylabel("first-token accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_title("Held-out template families and facts, clustered 95% intervals")
        ax.legend(frameon=False)
        fig.tight_layout()
        save_figure(fig, path)

    draw()


def _prompt_counts(a: Namespace) -> dict[str, int]:
    split, templates = make_split(a.split_seed), load_templates()

    def per_op(part: str, op: str) -> int:
        n_templates = sum(t.operation == op and t.id in split.templates_of(part) for t in templates)
        return n_templates * len(split.valid_pairs(part, op))

    def capped(n: int) -> int:  # --eval-limit caps every benchmark (one per training operation, one "arithmetic")
        return min(n, a.eval_limit) if a.eval_limit else n

    return {"validation": sum(capped(per_op("validation", op)) for op in a.ops),
            "test": capped(sum(per_op("test", op) for op in OPERATIONS)),
            "multidigit": sum(capped(TRANSFER_PER_TEMPLATE * sum(t.operation == op and t.id in split.test_templates
                                                                 for t in templates)) for op in a.ops)}  # fmt: skip


def print_estimate(out: Path, a: Namespace, timing: dict[str, Any]) -> None:
    """Extrapolate the measured step and evaluation times to the whole table (printed and in estimate.json)."""
    counts = _prompt_counts(a)
    test = read_json(out / "estimate" / "base" / "eval-test" / "metadata.json")["benchmarks"]
    gen = read_json(out / "estimate" / "base" / "eval-general" / "metadata.json")["benchmarks"]
    per_prompt = statistics.fmean(b["seconds"] / b["n"] for b in test.values())
    general_row = sum(b["seconds"] / b["n"] for b in gen.values()) * a.general_limit
    load = max(0.0, timing["eval_call_s"] - sum(b["seconds"] for b in [*test.values(), *gen.values()])) / 2
    trainings, swept, n_rows = plan_counts(a)
    train_s = sum(n * (a.steps * timing[_kind(name)]["s_per_step"] + load) for name, n in trainings.items())
    val_s = swept * (counts["validation"] * per_prompt + load)
    test_s = n_rows * ((counts["test"] + counts["multidigit"]) * per_prompt * 1.1 + general_row + 2 * load)
    total = (timing.get("identify_s") or 0) + train_s + val_s + test_s
    steps = ", ".join(f"{k} {v['s_per_step']:.1f} s/step" for k, v in timing.items() if isinstance(v, dict))
    lines = [f"measured: {steps}; {per_prompt:.3f} s per arithmetic prompt; MMLU+CSQA+general {general_row:.0f} s "
             f"per row; model load ~{load:.0f} s per call",
             f"plan: {sum(trainings.values())} trainings x {a.steps} steps x {a.batch_size} prompts, {swept} "
             f"validation evaluations x {counts['validation']} prompts, {n_rows} rows x {counts['test']} test + "
             f"{counts['multidigit']} multi-digit prompts",
             f"estimate: identify {timing.get('identify_s') or 0:.0f} s + training {train_s / 60:.1f} min + validation "
             f"{val_s / 60:.1f} min + test {test_s / 60:.1f} min = {total / 60:.0f} min on this machine"]  # fmt: skip
    (out / "estimate.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plan_counts(a: Namespace) -> tuple[dict[str, int], int, int]:
    """Trainings per row type (every rate x the sweep's seeds, then the other seeds at the chosen rate), validation
    evaluations (each swept training's and base's), and rows tested (base, one per seed of every precise row, full,
    LoRA)."""
    swept = min(getattr(a, "sweep_seeds", a.seeds), a.seeds)
    precise = {f"precise-{side}{k}" for k in a.ks for side in ("top", "random")}
    trainings = {name: len(a.lrs_precise) * swept + a.seeds - swept for name in sorted(precise)}
    trainings.update(full=len(a.lrs_full), lora=len(a.lrs_lora))
    validations = len(precise) * len(a.lrs_precise) * swept + len(a.lrs_full) + len(a.lrs_lora) + 1
    return trainings, validations, 1 + 2 * len(a.ks) * a.seeds + 2


def _kind(name: str) -> str:
    """The timed training that stands for a row type (random-k heads train like top-k heads)."""
    return name.replace("precise-random", "precise-top")
