"""The README's Performance tables, rendered from benchmarks/results.json so the two cannot disagree.

One table per size (`suite.SIZES`): full (each script's defaults, `compare.py --full --update`), then quick (what
`make bench` compares against). Each row is one benchmark as recorded: its exact command, the fast side's and the
baseline's time (or rate), the ratio of the two measured in that run, and its correctness check; each caption
names the date, machine and commit of its runs. The README holds the rendered text between the marker lines
`<!-- bench:begin -->` and `<!-- bench:end -->`; tests/unit/test_bench_compare.py fails when it differs from what
results.json renders.

    python benchmarks/readme_tables.py           # print the section
    python benchmarks/readme_tables.py --write   # rewrite README.md between the markers (make bench-update runs it)
    python benchmarks/readme_tables.py --check   # exit 1 when README.md differs from results.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare import RESULTS, Results, load_results
from suite import BENCHMARKS, SIZES, Size

from arithmech.runs import atomic_write_text

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
Metrics = Mapping[str, Any]


@dataclass(frozen=True)
class Shown:
    """How one benchmark's recorded metrics appear in a row: the two sides of its ratio and its check."""

    what: str
    fast: str
    """Metric of the fast side."""
    baseline: str | None
    """Metric of the baseline side; None when the script records only the ratio."""
    unit: str
    check: Callable[[Metrics], str]


SHOWN: dict[str, Shown] = {
    "path_patching": Shown(
        "path patching, every head and MLP: fast engine vs one forward pass per component (sampled, scaled)",
        "fast_s", "loop_s", "s", lambda m: f"max \\|fast - loop\\| {m['max_abs_diff']:.1e}",
    ),
    "knockout": Shown(
        "knockout sweep: batched configurations vs one configuration per forward pass",
        "batched_s", "loop_s", "s",
        lambda m: "accuracies identical" if m["accuracies_agree"] else "accuracies DIFFER",
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
    "gpu_scan": Shown(
        "path patching on a random-init LLaMA2-7B-shaped model (fp16): fast engine vs one forward pass per "
        "component (sampled, scaled)",
        "fast_s", None, "s", lambda m: f"{m['prompts_per_s']:.0f} prompts/s, peak {m['peak_memory_gib']:.1f} GiB",
    ),
    "gpu_finetune": Shown(
        "precise SFT (32 heads) vs full SFT on a random-init LLaMA2-7B-shaped model (bf16): seconds per step",
        "precise_s_per_step", "full_s_per_step", "s/step",
        lambda m: f"peak memory {m['precise_peak_gib']:.1f} vs {m['full_peak_gib']:.1f} GiB",
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
    """`AMD EPYC, 2 logical cores, torch 2.13.0+cpu, cpu` (plus the GPU's name on CUDA)."""
    gpu = f" ({machine['gpu']})" if machine.get("gpu") else ""
    cores = f"{machine['logical_cores']} logical cores"
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


def table(size: Size, entries: Mapping[str, Mapping[str, Any]]) -> str:
    """The caption and table of one size, benchmarks in suite order."""
    if not entries:
        return f"{CAPTIONS[size]}: nothing recorded yet."
    unknown = [name for name in entries if name not in SHOWN]
    if unknown:
        raise KeyError(f"results.json has {', '.join(unknown)}, which readme_tables.SHOWN does not show; add it")
    order = [b.name for b in BENCHMARKS if b.name in entries]
    lines = [f"{CAPTIONS[size]}; {provenance({n: entries[n] for n in order})}:", "",
             "| benchmark | command | fast side | baseline | ratio | check |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name in order:
        shown, entry = SHOWN[name], entries[name]
        metrics = entry["metrics"]
        baseline = "-" if shown.baseline is None else _number(metrics[shown.baseline], shown.unit)
        cells = [shown.what, f"`{entry['command']}`", _number(metrics[shown.fast], shown.unit), baseline,
                 _ratio(metrics["speedup"]), shown.check(metrics)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(results: Results) -> str:
    """The whole README section, markers included."""
    tables = "\n\n".join(table(size, results[size]) for size in SIZES)
    note = "<!-- rendered from benchmarks/results.json by `python benchmarks/readme_tables.py --write`; do not edit -->"
    return f"{BEGIN}\n{note}\n{tables}\n{END}"


def replace_section(readme: str, section: str) -> str:
    """`readme` with the text from the BEGIN marker line to the END marker line replaced by `section`."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"the README must hold one {BEGIN} line followed by one {END} line")
    return readme[: readme.index(BEGIN)] + section + readme[readme.index(END) + len(END) :]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--readme", type=Path, default=README)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the README's section")
    action.add_argument("--check", action="store_true", help="exit 1 when the README's section differs")
    args = parser.parse_args(argv)
    results = load_results(args.results)
    if results is None:
        sys.exit(f"{args.results} does not exist; run `make bench-update` first")
    section = render(results)
    if not (args.write or args.check):
        print(section)
        return 0
    readme = args.readme.read_text(encoding="utf-8")
    wanted = replace_section(readme, section)
    if args.check:
        if wanted != readme:
            print(f"{args.readme}'s Performance tables differ from {args.results}; run {Path(__file__).name} --write")
            return 1
        return 0
    if wanted != readme:
        atomic_write_text(args.readme, wanted)
    print(f"{args.readme}: Performance tables rendered from {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
