"""The scale guide's tables (docs/guides/scale.md), rendered so that none can disagree with what computes them.

Two sections, each between its marker lines:
- the plan at the paper's sizes (`<!-- scale-plan:begin -->`): every preset at full depth in bfloat16, each stage run
  of skeleton_stages.RUNS at its `paper` settings (1,000 prompts a stage, k = 32 heads, 3,260 SFT rows), planned
  peak memory and estimated time on an H100 80 GB, an A100 40 GB and a 24 GB RTX 4090, from `plan_stage` alone (no
  measurement). A run whose planned peak is above a device's memory is placed on the fewest GPUs (2, 4 or 8) that
  hold it: FSDP2 for fine-tuning, `--device auto` (layers spread over the GPUs) otherwise;
- the skeletons as measured (`<!-- skeletons:begin -->`): the full-size entries of plan_skeletons.py (planned over
  measured memory per run and skeleton, and per added layer) and skeleton_numerics.py (16-bit against float32)
  in benchmarks/results.json, "not measured yet" while it has none.

tests/unit/test_scale_tables.py fails when the guide differs from the render.

    python benchmarks/scale_tables.py           # print both sections
    python benchmarks/scale_tables.py --write   # rewrite them in the guide
    python benchmarks/scale_tables.py --check   # exit 1 when the guide differs
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from compare import RESULTS, Results, load_results
from plan_skeletons import TOLERANCE
from readme_tables import provenance, replace_section
from skeleton_numerics import TOP
from skeleton_stages import PAPER_HEADS, PAPER_PROMPTS, RUNS, StageRun, stage_config
from speed_claims import NOT_MEASURED

from arithmech.errors import ConfigError
from arithmech.plan.budget import MemoryBudget
from arithmech.plan.devices import BANDWIDTH_EFFICIENCY, MATMUL_EFFICIENCY, PROFILES
from arithmech.plan.planner import DEFAULT_TOKENS, PAPER_SFT_ROWS, PROMPT_TOKENS, PlanOptions, StagePlan, plan_stage
from arithmech.plan.presets import PRESETS
from arithmech.plan.record import _duration
from arithmech.plan.shape import DTYPE_BYTES
from arithmech.plan.sizes import format_size
from arithmech.plan.work import estimated_seconds
from arithmech.runs import atomic_write_text

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "scale.md"
PLAN_BEGIN, PLAN_END = "<!-- scale-plan:begin -->", "<!-- scale-plan:end -->"
MEASURED_BEGIN, MEASURED_END = "<!-- skeletons:begin -->", "<!-- skeletons:end -->"
DEVICES = ("h100", "a100-40", "rtx4090")
DTYPE = "bfloat16"
SPREAD = (2, 4, 8)
"""GPUs tried, fewest first, for a run that one device cannot hold."""
NOTE = "<!-- rendered by `python benchmarks/scale_tables.py --write`{}; do not edit -->"


@cache
def _plan(preset: str, key: str, processes: int) -> StagePlan:
    run = next(r for r in RUNS if r.key == key)
    options = PlanOptions(DTYPE, PROFILES[DEVICES[0]], processes)
    return plan_stage(PRESETS[preset], run.stage, stage_config(run, "paper"), options)


def _seconds(preset: str, plan: StagePlan, device: str) -> float | None:
    """The plan's single-process estimate on `device` (the plan's own work, re-timed for that profile)."""
    if plan.work is None:
        return None
    shape = PRESETS[preset]
    return estimated_seconds(shape, plan.work, plan.prompts, plan.tokens, PROFILES[device], DTYPE, DTYPE_BYTES[DTYPE])


def placement(preset: str, run: StageRun, device: str) -> str:
    """A device's cell, as the stage sizes itself under that device's memory (plan/budget.py, the same fit as
    --max-memory): on one device, its sizes lowered where it must (named), else on the fewest GPUs that hold it
    (FSDP2 for fine-tuning, which splits the time too; --device auto otherwise, which does not)."""
    for count in (1, *SPREAD):
        fitted = _fitted(preset, run, device, count)
        if fitted is None:
            continue
        plan, lowered = fitted
        seconds = _seconds(preset, plan, device)
        spread = run.stage == "finetune" and count > 1
        time = "" if seconds is None else _duration(seconds / (count if spread else 1))
        where = "" if count == 1 else f"{'FSDP2' if spread else '--device auto'} on {count}, "
        return where + time + (f" at {lowered}" if lowered else "")
    return f"no layout of {SPREAD[-1]} holds it even at the smallest sizes"


def _fitted(preset: str, run: StageRun, device: str, count: int) -> tuple[StagePlan, str] | None:
    """The plan of the run fitted to `count` devices of this kind, and the sizes it lowered; None if none fit."""
    spread = {} if count == 1 else ({"fsdp_processes": count, "launched": count} if run.stage == "finetune"
                                    else {"gpus": count})  # fmt: skip
    budget = MemoryBudget(PRESETS[preset], DTYPE, PROFILES[device].memory or 0, device, given=False, **spread)
    try:
        fit = budget.fit(stage_config(run, "paper"))
    except ConfigError:
        return None
    lowered = ", ".join(f"{k.replace('_', ' ')} {v['to']}" for k, v in fit.details["lowered"].items())
    options = PlanOptions(DTYPE, PROFILES[device], count if run.stage == "finetune" else 1)
    return plan_stage(PRESETS[preset], run.stage, fit.cfg, options), lowered


def plan_section() -> str:
    """The planner's table at the paper's sizes (module docstring)."""
    devices = [PROFILES[name] for name in DEVICES]
    head = ["model", "stage", "planned peak", *(d.note for d in devices)]
    lines = [
        f"Planned by `plan_stage` for each preset at full depth in {DTYPE}, at the paper's sizes: {PAPER_PROMPTS:,} "
        f"prompts a stage (spread over its tasks or operations), k = {PAPER_HEADS} heads, {PAPER_SFT_ROWS:,} SFT "
        "rows; every other setting the stage's default (skeleton_stages.py `paper`). Prompts have the plan's assumed "
        f"widths (the presets ship no tokenizer): {DEFAULT_TOKENS} tokens, circuit {PROMPT_TOKENS['circuit']}, "
        f"evaluate (zero-shot arithmetic here) {PROMPT_TOKENS['evaluate']}. Memory is planned, per process; "
        f"time is estimated (a roofline: {MATMUL_EFFICIENCY:.0%} of the data-sheet FLOP/s, "
        f"{BANDWIDTH_EFFICIENCY:.0%} of its bandwidth), never measured. A time alone means one device "
        "holds the run, at the sizes the stage chooses under that device's memory (`--max-memory`'s fit; "
        "\"at\" names any it lowers); otherwise the fewest GPUs of that kind that hold it, with FSDP2 "
        "(fine-tuning: time split over them) or `--device auto` (layers spread over them, time unchanged).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for preset, shape in PRESETS.items():
        name = f"{preset} ({shape.n_params / 1e9:.2f} B)"
        for run in RUNS:
            peak = format_size(_plan(preset, run.key, 1).memory["single"].peak)
            cells = [name, run.key, peak, *(placement(preset, run, device) for device in DEVICES)]
            lines.append("| " + " | ".join(cells) + " |")
            name = ""
    return "\n".join([PLAN_BEGIN, NOTE.format(""), *lines, PLAN_END])


def _skeleton(row: Mapping[str, Any]) -> str:
    return f"{row['preset']} x {row['layers']}, {row['dtype']}"


def _ratio_cell(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row["status"] != "measured":
        return row["status"]
    if not row["measured_bytes"]:
        return "0 measured"
    ratio = row["planned_bytes"] / row["measured_bytes"]
    shown = f"{ratio:.2f}" if abs(ratio - 1) <= TOLERANCE else f"**{ratio:.2f}**"
    return f"{shown} ({format_size(row['planned_bytes'])} / {format_size(row['measured_bytes'])})"


def skeleton_tables(entry: Mapping[str, Any]) -> list[str]:
    """plan_skeletons.py's entry: planned / measured per run and skeleton, then per added layer."""
    m = entry["metrics"]
    rows, growth = m["rows"], m["growth"]
    keys = [run.key for run in RUNS if any(r["stage"] == run.key for r in rows)]
    skeletons = list(dict.fromkeys(_skeleton(r) for r in rows))
    by = {(_skeleton(r), r["stage"]): r for r in rows}
    lines = [
        "Planned over measured peak memory above the weights (planned / measured), per stage run, on skeletons of "
        f"the presets' real widths (`{entry['command']}`; {provenance({'plan_skeletons': entry})}). Measured: the "
        f"{m['memory_measured_as']}. {m['runs_within_tolerance']} of {m['runs_measured']} runs within "
        f"{TOLERANCE:.0%} (bold: outside it); {m['runs_skipped']} skipped (planned above the memory at hand), "
        f"{m['runs_failed']} failed.",
        "",
        "| skeleton | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    lines += ["| " + " | ".join([s, *(_ratio_cell(by.get((s, k))) for k in keys)]) + " |" for s in skeletons]
    if growth:
        pairs = list(dict.fromkeys((g["preset"], g["dtype"]) for g in growth))
        per = {(g["preset"], g["dtype"], g["stage"]): g for g in growth}
        lines += ["", "Planned over measured growth per added layer, from the shallower skeleton to the deeper "
                  "(planned / measured bytes a layer: a ratio of two small growths is noise).", "",
                  "| skeleton | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]  # fmt: skip
        for preset, dtype in pairs:
            cells = [_growth_cell(per.get((preset, dtype, k))) for k in keys]
            lines.append("| " + " | ".join([f"{preset}, {dtype}", *cells]) + " |")
        lines += ["", _full_depth(growth, by)]
    return lines


def _full_depth(growth: Sequence[Mapping[str, Any]], by: Mapping[tuple[str, str], Mapping[str, Any]]) -> str:
    """One sentence: planned over measured at each preset's full depth, extrapolated from the deeper skeleton by the
    growth per layer on both sides (an estimate from the measurements, not one)."""
    ratios = []
    for g in growth:
        deeper = by[(_skeleton({**g, "layers": g["layers"][1]}), g["stage"])]
        more = PRESETS[g["preset"]].n_layers - g["layers"][1]
        planned = deeper["planned_bytes"] + more * g["planned_per_layer"]
        measured = deeper["measured_bytes"] + more * g["measured_per_layer"]
        ratios.append((planned / measured, f"{g['preset']} {g['dtype']} {g['stage']}"))
    ratios.sort()
    under = [f"{name} ({ratio:.2f})" for ratio, name in ratios if ratio < 1 - TOLERANCE]
    return (f"Extrapolated to each preset's full depth (the deeper skeleton's peak plus the growth per layer, on both "
            f"sides: an estimate from the measurements), planned over measured runs from {ratios[0][0]:.2f} "
            f"({ratios[0][1]}) to {ratios[-1][0]:.2f} ({ratios[-1][1]}); "
            + (f"below {1 - TOLERANCE:.2f}: {', '.join(under)}." if under else
               f"none below {1 - TOLERANCE:.2f}, so no stage is planned short by more than {TOLERANCE:.0%} there."))


def _growth_cell(g: Mapping[str, Any] | None) -> str:
    if g is None:
        return "-"
    sizes = f"{format_size(g['planned_per_layer'])} / {format_size(g['measured_per_layer'])}"
    if g["measured_per_layer"] <= 0:
        return f"none measured ({sizes})"
    return f"{g['planned_per_layer'] / g['measured_per_layer']:.2f} ({sizes})"


def numerics_table(entry: Mapping[str, Any]) -> list[str]:
    """skeleton_numerics.py's entry: each 16-bit dtype against float32 on the same weights."""
    m = entry["metrics"]
    lines = [
        f"16-bit against float32 on the same weights (`{entry['command']}`; {provenance({'skeleton_numerics': entry})})"
        f": largest difference over the largest float32 score, Spearman, the top-{TOP} agreement, non-finite values;"
        " float32's largest |value| (residual stream or logits) against float16's 65,504.",
        "",
        "| skeleton | dtype | method | max rel. diff | Spearman | top-32 | non-finite | float16 headroom |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in m["rows"]:
        lines.append(f"| {r['preset']} x {r['layers']} | {r['dtype']} | {r['method']} | {r['max_rel_diff']:.1e} | "
                     f"{r['spearman']:.4f} | {r['top_agreement']:.2f} | {r['nonfinite']} | "
                     f"{r['float16_headroom']:,.0f}x |")  # fmt: skip
    return lines


def measured_section(results: Results | None) -> str:
    """The skeletons' measured tables from results.json's full-size entries (module docstring)."""
    full = {} if results is None else results["full"]
    parts: list[str] = []
    for name, render in (("plan_skeletons", skeleton_tables), ("skeleton_numerics", numerics_table)):
        if name in full:
            parts += [*render(full[name]), ""]
        else:
            parts += [f"{name}: {NOT_MEASURED} (`python benchmarks/compare.py --full --only {name} --update`, "
                      "then `python benchmarks/scale_tables.py --write`).", ""]  # fmt: skip
    note = NOTE.format(" from benchmarks/results.json")
    return "\n".join([MEASURED_BEGIN, note, *parts[:-1], MEASURED_END])


def render(page: str, results: Results | None) -> str:
    """`page` with both sections rendered."""
    page = replace_section(page, plan_section(), PLAN_BEGIN, PLAN_END)
    return replace_section(page, measured_section(results), MEASURED_BEGIN, MEASURED_END)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--guide", type=Path, default=GUIDE)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the guide's sections")
    action.add_argument("--check", action="store_true", help="exit 1 when the guide's sections differ")
    args = parser.parse_args(argv)
    results = load_results(args.results)
    if not (args.write or args.check):
        print(plan_section() + "\n\n" + measured_section(results))
        return 0
    text = args.guide.read_text(encoding="utf-8")
    wanted = render(text, results)
    if wanted == text:
        return 0
    if args.check:
        print(f"{args.guide} differs from its render; run {Path(__file__).name} --write")
        return 1
    atomic_write_text(args.guide, wanted)
    print(f"{args.guide}: the plan at the paper's sizes and the skeletons' tables rendered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
