"""The Performance tables of the docs (docs/performance.md) and the README's speed paragraph, rendered from
benchmarks/results.json so that neither can disagree with it.

One table per size (`suite.SIZES`): full (each script's defaults, `compare.py --full --update`), then quick (what
`make bench` compares against). Each row is one measurement of a benchmark as recorded: its exact command, the fast
side's and the baseline's time (or rate), the ratio of the two measured in that run, and its correctness check
(a benchmark may show several rows; a row whose metrics an older entry lacks is left out, and a count an older
entry lacks is not shown); each caption names the date, machine and commit of its runs. The side-by-side
comparison with TransformerLens and nnsight (benchmarks/peers.py) gets a table of its own per size, one column
per prompt set, medians of interleaved repetitions with their min and max; an entry recorded before the
repetitions (single timings) is left out and said so.

"Forward passes" are counted in one unit (tests/forward_cost.py `prompt_forward_macs`): every prompt at its own
length, the logits of its last token only, which is what one forward pass per component costs. Counts in the
padded unit (the right-padded batch, logits at every position) appear beside them, labelled as padded. A number
the renderer needs and results.json lacks is rendered as "not measured yet", never filled in.

docs/performance.md holds the rendered tables between the marker lines `<!-- bench:begin -->` and
`<!-- bench:end -->`, README.md the speed paragraph between `<!-- speed:begin -->` and `<!-- speed:end -->`;
tests/unit/test_bench_compare.py fails when either differs from what results.json renders.

    python benchmarks/readme_tables.py           # print both sections
    python benchmarks/readme_tables.py --write   # rewrite them between the markers (make bench-update runs it)
    python benchmarks/readme_tables.py --check   # exit 1 when a page differs from results.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare import RESULTS, Results, load_results
from speed_claims import NOT_MEASURED, PEERS, peers_table, speed_paragraph, torch_threads, wrap
from suite import BENCHMARKS, SIZES, Size

from arithmech.runs import atomic_write_text

PAGE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
README_BEGIN = "<!-- speed:begin -->"
README_END = "<!-- speed:end -->"
Metrics = Mapping[str, Any]


@dataclass(frozen=True)
class Shown:
    """How one benchmark's recorded metrics appear in a row: the two sides of its ratio and its check."""

    what: str | Callable[[Metrics], str]
    """The row's description, or a function of the entry's metrics giving it."""
    fast: str
    """Metric of the fast side."""
    baseline: str | None
    """Metric of the baseline side; None when the script records only the ratio."""
    unit: str
    check: Callable[[Metrics], str]
    ratio: str = "speedup"
    """Metric of the ratio of the two sides."""

    def describe(self, m: Metrics) -> str:
        return self.what if isinstance(self.what, str) else self.what(m)


def _passes(m: Metrics, variant: str, rows: str = "prompts") -> str:
    """`; 3.56 forward passes of the prompts, 1.92 padded (counted)`: the scan's count in the prompt unit (with
    the loop's, per component, where recorded) and in the padded one; an entry recorded before the prompt unit
    has its padded count only, labelled, and one without counts nothing."""
    prompt, padded = m.get(f"{variant}_prompt_passes"), m.get(f"{variant}_passes")
    if prompt is None and padded is None:
        return ""
    text = f"; {NOT_MEASURED} in forward passes of the {rows}" if prompt is None else (
        f"; {prompt:.2f} forward passes of the {rows}")  # fmt: skip
    if "loop_prompt_passes" in m:
        text += f" (the loop {m['loop_prompt_passes']:.2f} per component)"
    padded_text = "" if padded is None else f", {padded:.2f} of the right-padded {rows} with logits at every position"
    return f"{text}{padded_text} (counted)"


def _loop(what: str) -> Callable[[Metrics], str]:
    """`what` and the loop's batch: the engine's length chunks, or (entries recorded before the loop ran them,
    without `loop_prompt_passes`) the right-padded batch, which gave the engine a ratio partly of padding."""

    def describe(m: Metrics) -> str:
        if "loop_prompt_passes" in m:
            return f"{what}, both in the engine's length chunks (sampled, scaled)"
        return (f"{what}, the loop on the right-padded batch (sampled, scaled; recorded before the loop ran the "
                "engine's length chunks)")

    return describe


def _planned(m: Metrics, prefix: str) -> str:
    """`; precise: planned 1.20 GiB above the weights, measured 1.10 GiB` where the entry holds the plan beside its
    measurement (plan_check.py); nothing for an entry recorded before it."""
    if f"{prefix}planned_gib" not in m:
        return ""
    who = f"{prefix.rstrip('_')}: " if prefix else ""
    planned, measured = m[f"{prefix}planned_gib"], m[f"{prefix}measured_gib"]
    return f"; {who}planned {planned:.2f} GiB above the weights, measured {measured:.2f} GiB"


def _knockout_check(m: Metrics) -> str:
    """Entries recorded before the per-prompt probabilities were compared checked the accuracies only."""
    if "max_prob_diff" not in m:
        return "accuracies identical" if m["accuracies_agree"] else "accuracies DIFFER"
    same = "answers right on the same prompts" if m["accuracies_agree"] else "answers DIFFER"
    return f"{same}, max \\|P(answer) difference\\| {m['max_prob_diff']:.1e}"


ELSEWHERE = {"plan_skeletons": "docs/guides/scale.md", "skeleton_numerics": "docs/guides/scale.md"}
"""Benchmarks whose tables another page renders (scale_tables.py), left out of the Performance tables."""
SHOWN: dict[str, Shown | tuple[Shown, ...]] = {
    "path_patching": (
        Shown(
            _loop("path patching, every head and MLP: fast engine vs one forward pass per component"),
            "fast_s", "loop_s", "s",
            lambda m: f"max \\|fast - loop\\| {m['max_abs_diff']:.1e}{_passes(m, 'path')}",
        ),
        Shown(
            _loop("activation patching at END (`--variant total`), every head and MLP: fast engine vs one forward "
                  "pass per component"),
            "total_s", "total_loop_s", "s",
            lambda m: f"max \\|fast - loop\\| {m['total_max_abs_diff']:.1e}{_passes(m, 'total')}",
            ratio="total_speedup",
        ),
    ),
    "answer_digits": (
        Shown(
            _loop("per-digit path patching (`identify --answer-digits`, two-digit sums, every head and MLP at each "
                  "answer token): fast engine vs one forward pass per component"),
            "fast_s", "loop_s", "s",
            lambda m: f"max \\|fast - loop\\| {m['max_abs_diff']:.1e}{_passes(m, 'path', 'rows')}; {m['rows']} rows "
            "(prompt x answer token)",
        ),
        Shown(
            _loop("per-digit activation patching at END (`--answer-digits --variant total`): fast engine vs one "
                  "forward pass per component"),
            "total_s", "total_loop_s", "s",
            lambda m: f"max \\|fast - loop\\| {m['total_max_abs_diff']:.1e}{_passes(m, 'total', 'rows')}",
            ratio="total_speedup",
        ),
    ),
    "knockout": Shown(
        "knockout sweep: batched configurations vs one configuration per forward pass",
        "batched_s", "loop_s", "s",
        _knockout_check,
    ),
    "attribution": Shown(
        "attribution patching vs exact (fast) path patching, every head and MLP",
        "attribution_s", "exact_s", "s",
        lambda m: f"Spearman {m['spearman_all']:.2f}, top-10 overlap {m['top10_overlap']:.2f}",
    ),
    "mediation": Shown(
        "causal mediation, every MLP and attention output at every position: batched vs one intervention per "
        "forward pass (sampled, scaled)",
        "batched_s", "loop_s", "s", lambda m: f"max scaled \\|IE difference\\| {m['max_scaled_ie_diff']:.1e}",
    ),
    "finetune": Shown(
        "precise SFT (top-10 heads) vs full SFT, same data and schedule: training samples/s",
        "precise_samples_per_s", "full_samples_per_s", "samples/s",
        lambda m: f"peak memory {m['memory_ratio']:.2f}x lower",
    ),
    "circuits": (
        Shown(
            "EAP-IG over all edges of MIB's graph (m = 5) vs one plain forward pass of the same batch; the ratio is "
            "in forward-pass equivalents (target: at most 20)",
            "eap_ig_s", "plain_forward_s", "s",
            lambda m: f"peak {m['eap_ig_peak_mib_per_prompt']:.0f} MiB per prompt (live tensors), "
            f"{m['eap_ig_stored_mib_per_prompt']:.0f} MiB kept",
            ratio="eap_ig_passes",
        ),
        Shown(
            "EAP over all edges vs one plain forward pass (forward-pass equivalents)",
            "eap_s", "plain_forward_s", "s", lambda m: "-", ratio="eap_passes",
        ),
        Shown(
            "faithfulness sweep, 10 sizes, signed and absolute rankings (CPR, CMD) vs one plain forward pass "
            "(forward-pass equivalents; target: about 25)",
            "sweep_s", "plain_forward_s", "s", lambda m: "exact (tests: equal to one forward per circuit)",
            ratio="sweep_passes",
        ),
    ),
    "circuit_oracle": Shown(
        "exact edge oracle (`circuit --oracle`): a receiver's edges batched, each pass from the receiver's layer "
        "and the first position where the prompts differ, vs one full patched forward pass per edge: ms per edge",
        "oracle_ms_per_edge", "naive_ms_per_edge", "ms",
        lambda m: f"max \\|oracle - loop\\| {m['max_abs_diff']:.1e}; {m['oracle_passes_per_edge']:.2f} plain forward "
        f"passes of the batch per edge (counted; cost model {m['model_passes_per_edge']:.2f})",
    ),
    "numbers_sweep": Shown(
        "analyze numbers, the family x layer sweep: every variant a row joining the cached clean and corrupted runs "
        "at its layer vs one patched forward pass per variant (sampled, scaled)",
        "stage_s", "naive_s", "s",
        lambda m: f"max \\|stage - plain hooks\\| {m['max_abs_diff']:.1e} (mean LD of checked cells); the sweep "
        f"{m['sweep_passes']:.2f} forward passes of the pairs vs {m['naive_passes']:.1f} (counted)",
    ),
    "gpu_scan": Shown(
        "path patching on a random-init LLaMA2-7B-shaped model (fp16): fast engine vs one forward pass per "
        "component (sampled, scaled)",
        "fast_s", None, "s", lambda m: f"{m['prompts_per_s']:.0f} prompts/s, peak {m['peak_memory_gib']:.1f} GiB"
        + (f", max \\|fast - loop\\| {m['max_abs_diff']:.1e}" if "max_abs_diff" in m else "") + _planned(m, ""),
    ),
    "gpu_finetune": Shown(
        "precise SFT (32 heads) vs full SFT on a random-init LLaMA2-7B-shaped model (bf16): seconds per step",
        "precise_s_per_step", "full_s_per_step", "s/step",
        lambda m: f"peak memory {m['precise_peak_gib']:.1f} vs {m['full_peak_gib']:.1f} GiB"
        + _planned(m, "precise_") + _planned(m, "full_"),
    ),
}  # fmt: skip

CAPTIONS: dict[Size, str] = {
    "full": "Full size, each script's defaults (`make bench-full-update`, i.e. `python benchmarks/compare.py --full "
    "--update`)",
    "quick": "Quick size, what `make bench` compares against (`make bench-update`)",
}


def _number(value: float, unit: str) -> str:
    text = f"{value:,.0f}" if value >= 100 else f"{value:#.3g}"
    return f"{text} {unit}"


def _ratio(value: float) -> str:
    return f"**{value:.1f}x**" if value >= 10 else f"**{value:.2f}x**"


def machine_text(machine: Mapping[str, Any]) -> str:
    """`AMD EPYC, 2 logical cores, 1 torch thread, torch 2.13.0+cpu, cpu` (plus the GPU's name on CUDA)."""
    gpu = f" ({machine['gpu']})" if machine.get("gpu") else ""
    threads = f", {torch_threads(machine)}" if torch_threads(machine) else ""
    cores = f"{machine['logical_cores']} logical cores{threads}"
    return f"{machine['cpu']}, {cores}, torch {machine['torch']}, {machine['device']}{gpu}"


def provenance(entries: Mapping[str, Mapping[str, Any]]) -> str:
    """When, where and at which commit the entries were measured; benchmarks named where runs differ."""
    groups: dict[str, list[str]] = {}
    for name, entry in entries.items():
        where = f"{entry['date']} on {machine_text(entry['machine'])}, git {entry['git_sha'][:7]}"
        groups.setdefault(where, []).append(name)
    if len(groups) == 1:
        return f"measured {next(iter(groups))}"
    return "measured " + "; ".join(f"{', '.join(names)}: {where}" for where, names in groups.items())


def rows_of(name: str) -> tuple[Shown, ...]:
    """The rows that show benchmark `name`."""
    shown = SHOWN[name]
    return shown if isinstance(shown, tuple) else (shown,)


def table(size: Size, entries: Mapping[str, Mapping[str, Any]]) -> str:
    """The caption and table of one size, benchmarks in suite order (peers apart: `peers_table`)."""
    entries = {name: entry for name, entry in entries.items() if name != PEERS and name not in ELSEWHERE}
    if not entries:
        return f"{CAPTIONS[size]}: nothing recorded yet."
    unknown = [name for name in entries if name not in SHOWN]
    if unknown:
        raise KeyError(f"results.json has {', '.join(unknown)}, which readme_tables.SHOWN does not show; add it")
    order = [b.name for b in BENCHMARKS if b.name in entries]
    lines = [f"{CAPTIONS[size]}; {provenance({n: entries[n] for n in order})}:", "",
             "| benchmark | command | fast side | baseline | ratio | check |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name in order:
        entry = entries[name]
        metrics = entry["metrics"]
        for shown in (s for s in rows_of(name) if s.fast in metrics):
            baseline = "-" if shown.baseline is None else _number(metrics[shown.baseline], shown.unit)
            cells = [shown.describe(metrics), f"`{entry['command']}`", _number(metrics[shown.fast], shown.unit),
                     baseline, _ratio(metrics[shown.ratio]), shown.check(metrics)]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(results: Results) -> str:
    """The whole section of the performance page, markers included."""
    peers = [peers_table(size, entry, provenance({PEERS: entry}) if entry else "")
             for size, entry in ((size, results[size].get(PEERS)) for size in SIZES)]  # fmt: skip
    tables = "\n\n".join([table(size, results[size]) for size in SIZES] + peers)
    note = "<!-- rendered from benchmarks/results.json by `python benchmarks/readme_tables.py --write`; do not edit -->"
    return f"{BEGIN}\n{note}\n{tables}\n{END}"


def render_readme(results: Results) -> str:
    """The README's speed paragraph, markers included (from the full-size entries)."""
    note = "<!-- rendered from benchmarks/results.json by `python benchmarks/readme_tables.py --write`; do not edit -->"
    return f"{README_BEGIN}\n{note}\n{wrap(speed_paragraph(results['full']))}\n{README_END}"


def replace_section(page: str, section: str, begin: str = BEGIN, end: str = END) -> str:
    """`page` with the text from the `begin` marker line to the `end` marker line replaced by `section`."""
    if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
        raise ValueError(f"the page must hold one {begin} line followed by one {end} line")
    return page[: page.index(begin)] + section + page[page.index(end) + len(end) :]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--readme", type=Path, default=README)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the pages' sections")
    action.add_argument("--check", action="store_true", help="exit 1 when a page's section differs")
    args = parser.parse_args(argv)
    results = load_results(args.results)
    if results is None:
        sys.exit(f"{args.results} does not exist; run `make bench-update` first")
    sections = [(args.page, render(results), BEGIN, END), (args.readme, render_readme(results), README_BEGIN,
                                                            README_END)]  # fmt: skip
    if not (args.write or args.check):
        print("\n\n".join(section for _, section, _, _ in sections))
        return 0
    stale = []
    for page, section, begin, end in sections:
        text = page.read_text(encoding="utf-8")
        wanted = replace_section(text, section, begin, end)
        if wanted == text:
            continue
        if args.check:
            stale.append(str(page))
        else:
            atomic_write_text(page, wanted)
    if stale:
        print(f"{' and '.join(stale)} differ from {args.results}; run {Path(__file__).name} --write")
        return 1
    if args.write:
        print(f"{args.page} (Performance tables) and {args.readme} (speed paragraph) rendered from {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
