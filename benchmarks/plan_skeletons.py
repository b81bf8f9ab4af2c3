"""The plan checked against measurement: every stage on skeletons of the presets' real widths (issue 33, item 3).

Each skeleton (benchmarks/skeletons.py) is a random-init model with a preset's hidden size, heads, key-value heads,
MLP width and vocabulary, cut to 2 and 4 layers, in bfloat16 and float32. Every stage runs on it end to end as
`arithmech run` calls it (benchmarks/skeleton_stages.py: identify's path and total scans, knockout, circuit with EAP-IG,
the faithfulness sweep and two oracle edges, mediate, neurons, evaluate's generations, two precise-SFT and two
full-SFT steps) on a few prompts, and `plan_stage` plans the same call: the same shape, the same config, the
widest prompt the model embedded during the call (fine-tuning: each step at its own, `planned`).

Recorded per run: the planned peak less the weights, the allocator's measured peak of live tensors above what was
live before the call (measured_peak.py: the same quantity on both sides), the process's resident peak beside it
(CPU only, never compared), wall seconds beside the plan's estimated seconds, and per (preset, dtype, stage) the
growth per layer from 2 to 4 layers, measured against the plan's per-layer term. The goal (issue 33): planned
within 15 % of measured (`TOLERANCE`) on every run of every skeleton.

A run whose planned peak is above the memory at hand (--max-memory; default: what the machine has free now) is
skipped and says so, before it starts: full SFT of a float32 skeleton with a 128k vocabulary plans ~30 GiB.

    python benchmarks/plan_skeletons.py --quick                  # tiny widths, seconds: the test's size
    python benchmarks/plan_skeletons.py --plan-only              # each run's plan and estimated time, no model
    python benchmarks/plan_skeletons.py --presets llama3.1-8b --layers 2 --dtypes bfloat16 --stages circuit
    python benchmarks/compare.py --full --only plan_skeletons --update; python benchmarks/scale_tables.py --write

The full run resumes (--resume FILE: finished runs are kept there, one JSON line each), so an interrupted run of
hours loses one stage at most. A kept run is reused at any commit whose measured code is the same (`measured_code`:
src/arithmech and the skeleton scripts, less the planner's own modules) and planned again by the current planner,
so a fix of the plan is judged against hours of measurements without repeating them.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import importlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from measured_peak import measure
from plan_check import profile_for, profile_label
from record import record
from skeleton_stages import KEYS, RUNS, StageRun, stage_config
from skeletons import MAX_POSITIONS, SKELETON_PRESETS, build_skeleton, skeleton_handle, skeleton_shape

from arithmech.finetune.arithmetic_data import arithmetic_examples
from arithmech.finetune.data import BatchPlan, rank_micro_batches
from arithmech.plan.devices import device_profile
from arithmech.plan.planner import PlanOptions, StagePlan, plan_stage
from arithmech.plan.shape import DTYPE_BYTES, ModelShape
from arithmech.plan.sizes import format_size, parse_size
from arithmech.runs import git_sha

from tiny_models import make_tiny_tokenizer

TOLERANCE = 0.15
"""Planned within this fraction of measured, either way (issue 33)."""
FREE_SHARE = 0.9
"""--max-memory's default: this share of the memory free when the benchmark starts."""


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


def selected_runs(keys: Sequence[str]) -> list[StageRun]:
    """The runs named, in run order, with the runs whose folders they read (knockout and SFT read identify's)."""
    wanted = set(keys)
    for run in RUNS:
        if run.key in wanted and run.reads:
            wanted.add(run.reads)
    return [run for run in RUNS if run.key in wanted]


def free_memory(device: str) -> int:
    """Bytes free now: the GPU's (cudaMemGetInfo) or the machine's (MemAvailable)."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(device)[0])
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo; give --max-memory")


def plan_of(
    shape: ModelShape, run: StageRun, cfg: Any, dtype: str, profile: Any, tokens: int | None, shared: int | None = None
) -> StagePlan:  # fmt: skip
    options = PlanOptions(dtype, profile, prompt_tokens=tokens or None, shared_tokens=shared)
    return plan_stage(shape, run.stage, cfg, options)


def finetune_widths(cfg: Any) -> list[int]:
    """The width of every micro-batch of a skeleton's fine-tuning run, in order (stages/finetune.py's data and
    finetune/train.py's batches): every skeleton reads the same test tokenizer, so these are every skeleton's."""
    tokenizer = make_tiny_tokenizer()
    tokenizer.model_max_length = MAX_POSITIONS  # as skeleton_handle's
    data, _ = arithmetic_examples(tokenizer, cfg.operations, cfg.max_samples, cfg.split_seed, cfg.seed,
                                  min(cfg.max_length, MAX_POSITIONS))  # fmt: skip
    batches = BatchPlan(len(data), cfg.batch_size, cfg.epochs, cfg.seed, cfg.max_steps)
    return [max(len(data[i].input_ids) for i in micro) for step in range(batches.total_steps)
            for micro in rank_micro_batches(batches.step_indices(step), 0, 1, cfg.micro_batch_size)]  # fmt: skip


def planned(
    shape: ModelShape, run: StageRun, cfg: Any, dtype: str, profile: Any, tokens: int | None, shared: int | None = None
) -> tuple[StagePlan, int]:  # fmt: skip
    """The plan of the call at its widest prompt, and its planned peak. For fine-tuning the peak is the larger of
    the steady state's, which the plan describes (the widest micro-batch after the first step, beside AdamW's
    moments), and the first step's: its own micro-batch, before any moment exists. The first step's micro-batch
    is the widest of the skeletons' (192 tokens against 140) and binds for precise SFT, whose moments are small."""
    plan = plan_of(shape, run, cfg, dtype, profile, tokens, shared)
    peak = plan.memory["single"].peak
    if run.stage == "finetune":
        first = plan_of(shape, run, cfg, dtype, profile, finetune_widths(cfg)[0]).memory["single"]
        peak = max(peak, dataclasses.replace(first, optimizer=0).peak)
    return plan, peak


def shared_tokens(run: StageRun, out: Path, tokenizer: Any) -> int | None:
    """circuit: the tokens every prompt of its run shares at the start, reference and counterfactual alike
    (prompts.jsonl, tokenized as the stage does); the skeletons' character-level tokenizer makes 15 of MIB's
    "Q: How much is ", where the plan's default assumes a BPE tokenizer's 6. None for other stages."""
    if run.stage != "circuit" or not (out / "prompts.jsonl").is_file():
        return None
    rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines() if line.strip()]
    ids = [tokenizer(row[k])["input_ids"] for row in rows for k in ("reference", "counterfactual")]
    if not ids:
        return None
    shared = 0
    while shared < min(len(i) for i in ids) - 1 and len({i[shared] for i in ids}) == 1:
        shared += 1
    return shared


def weights_bytes(shape: ModelShape, dtype: str) -> int:
    """The skeleton's weights, live before every measured call."""
    return shape.n_params * DTYPE_BYTES[dtype]


def _row(shape: ModelShape, preset: str, dtype: str, run: StageRun, **fields: Any) -> dict[str, Any]:
    return {"preset": preset, "layers": shape.n_layers, "dtype": dtype, "stage": run.key,
            "weights_bytes": weights_bytes(shape, dtype), **fields}  # fmt: skip


def skeleton_rows(
    preset: str, layers: int, dtype: str, runs: Sequence[StageRun], args: argparse.Namespace, budget: int,
    widest: dict[str, int], done: dict[tuple[Any, ...], dict[str, Any]],
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Measure (or, with --plan-only, plan) every run on one skeleton; rows already in `done` are given back."""
    shape = skeleton_shape(preset, layers, args.quick)
    profile = device_profile(args.device_profile)
    todo = [r for r in runs if (preset, layers, dtype, r.key) not in done]
    read = {r.reads for r in todo if r.reads is not None}  # a run to do needs the folder of the run it reads
    todo = [r for r in runs if r in todo or r.key in read]
    for run in runs:
        if run.key not in {r.key for r in todo}:
            yield replanned(done[(preset, layers, dtype, run.key)], shape, run, profile)
    if not todo:
        return
    if args.plan_only:
        for run in todo:
            plan, peak = planned(shape, run, stage_config(run, "small"), dtype, profile, widest.get(run.key))
            yield _row(shape, preset, dtype, run, status="planned", tokens=plan.tokens,
                       planned_bytes=peak - weights_bytes(shape, dtype), planned_peak_bytes=peak,
                       estimated_s=plan.seconds.get("single"))  # fmt: skip
        return
    model = build_skeleton(shape, dtype, args.seed, args.device)
    handle = skeleton_handle(model, shape.name)
    try:
        with tempfile.TemporaryDirectory(prefix="skeleton-") as scratch:
            folders: dict[str, Path] = {}
            for run in todo:
                row = _measure_run(shape, preset, dtype, run, handle, Path(scratch), folders, profile, budget, widest,
                                   args.device)  # fmt: skip
                yield row
    finally:
        del handle, model
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


def _measure_run(
    shape: ModelShape, preset: str, dtype: str, run: StageRun, handle: Any, scratch: Path, folders: dict[str, Path],
    profile: Any, budget: int, widest: dict[str, int], device: str,
) -> dict[str, Any]:  # fmt: skip
    """One stage run measured, or skipped before it starts when its plan is above `budget`."""
    cfg = stage_config(run, "small", folders)
    before, peak = planned(shape, run, cfg, dtype, profile, widest.get(run.key))
    if peak > budget:
        return _row(shape, preset, dtype, run, status="skipped", tokens=before.tokens,
                    planned_bytes=peak - weights_bytes(shape, dtype), planned_peak_bytes=peak,
                    note=f"planned peak {format_size(peak)} is above the {format_size(budget)} at hand")  # fmt: skip
    if run.reads is not None and run.reads not in folders:
        return _row(shape, preset, dtype, run, status="failed", note=f"{run.reads} did not finish; it reads its folder")
    module, name = run.function.split(":")
    function = getattr(importlib.import_module(module), name)
    out = scratch / run.key
    try:
        _, measured = measure(lambda: function(handle, cfg, out, quiet=True), handle.model, device)
    except Exception as err:  # a benchmark reports a stage that fails at real width, and goes on
        return _row(shape, preset, dtype, run, status="failed", note=f"{type(err).__name__}: {err}"[:300])
    folders[run.key] = out
    widest[run.key] = planned_width(run, measured)
    shared = shared_tokens(run, out, handle.tokenizer)
    plan, peak = planned(shape, run, cfg, dtype, profile, widest[run.key], shared)
    return _row(shape, preset, dtype, run, status="measured", tokens=plan.tokens, shared_tokens=shared,
                planned_bytes=peak - weights_bytes(shape, dtype), planned_peak_bytes=peak,
                measured_bytes=measured.tensor_bytes, rss_bytes=measured.rss_bytes, seconds=round(measured.seconds, 3),
                estimated_s=plan.seconds.get("single"))  # fmt: skip


def planned_width(run: StageRun, measured: Any) -> int:
    """The prompt width a plan of the call assumes: the widest input embedded; for fine-tuning the widest
    micro-batch after the first step's, the steady state's (`planned` plans the first step at its own width)."""
    widths = measured.widths
    if run.stage == "finetune" and len(widths) > 1:
        return max(widths[1:])
    return measured.widest_tokens


def replanned(row: dict[str, Any], shape: ModelShape, run: StageRun, profile: Any) -> dict[str, Any]:
    """A kept measurement with the current planner's memory plan of the same call (the same widest prompt); its
    time estimate stays the one made beside the measured seconds (a measured device profile differs per probe)."""
    plan, peak = planned(shape, run, stage_config(run, "small"), row["dtype"], profile, row["tokens"],
                         row.get("shared_tokens"))  # fmt: skip
    return {**row, "planned_bytes": peak - row["weights_bytes"], "planned_peak_bytes": peak}


def layer_growth(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (preset, dtype, stage) measured at two depths: bytes per added layer, planned and measured."""
    measured = {(r["preset"], r["dtype"], r["stage"], r["layers"]): r for r in rows if r["status"] == "measured"}
    growth = []
    for (preset, dtype, stage, layers), low in sorted(measured.items()):
        deeper = sorted(k[3] for k in measured if k[:3] == (preset, dtype, stage) and k[3] > layers)
        if not deeper:
            continue
        high = measured[(preset, dtype, stage, deeper[0])]
        added = deeper[0] - layers
        growth.append({"preset": preset, "dtype": dtype, "stage": stage, "layers": [layers, deeper[0]],
                       "planned_per_layer": (high["planned_bytes"] - low["planned_bytes"]) / added,
                       "measured_per_layer": (high["measured_bytes"] - low["measured_bytes"]) / added})  # fmt: skip
    return growth


def summary(rows: Sequence[dict[str, Any]], growth: Sequence[dict[str, Any]], how: str) -> dict[str, Any]:
    """results.json's entry: the counts compare.py judges, the extremes of planned / measured, and every row."""
    ratios = [r["planned_bytes"] / r["measured_bytes"] for r in rows if r["status"] == "measured"
              and r["measured_bytes"] > 0]  # fmt: skip
    return {
        "runs_measured": sum(r["status"] == "measured" for r in rows),
        "runs_failed": sum(r["status"] == "failed" for r in rows),
        "runs_skipped": sum(r["status"] == "skipped" for r in rows),
        "planned_over_measured_min": min(ratios, default=0.0),
        "planned_over_measured_max": max(ratios, default=0.0),
        "runs_within_tolerance": sum(abs(x - 1) <= TOLERANCE for x in ratios),
        "memory_measured_as": how,
        "rows": list(rows),
        "growth": list(growth),
    }


def _line(row: dict[str, Any]) -> str:
    where = f"{row['preset']} x {row['layers']} {row['dtype']:>8} {row['stage']:<16}"
    if row["status"] == "measured":
        ratio = row["planned_bytes"] / row["measured_bytes"] if row["measured_bytes"] else float("nan")
        rss = "" if row.get("rss_bytes") is None else f", process {format_size(row['rss_bytes'])}"
        estimate = "" if row.get("estimated_s") is None else f", estimated ~{row['estimated_s']:.1f} s"
        return (
            f"{where} T={row['tokens']:<4} planned {format_size(row['planned_bytes']):>10}  measured "
            f"{format_size(row['measured_bytes']):>10}  ({ratio:.2f}){rss}; {row['seconds']:.1f} s{estimate}"
        )
    if row["status"] == "planned":
        return (
            f"{where} T={row['tokens']:<4} planned {format_size(row['planned_bytes']):>10} above the weights, "
            f"peak {format_size(row['planned_peak_bytes'])}; estimated ~{row['estimated_s'] or 0:.1f} s"
        )
    return f"{where} {row['status']}: {row.get('note', '')}"


MEASURED_CODE = ("src/arithmech", "benchmarks/skeleton_stages.py", "benchmarks/skeletons.py",
                 "benchmarks/measured_peak.py", "tests/allocation_peak.py")  # fmt: skip
"""What a measurement depends on; src/arithmech/plan/ is left out of it (see `measured_code`)."""


def measured_code(sha: str) -> str | None:
    """A digest of the files in MEASURED_CODE at commit `sha`, less the planner (src/arithmech/plan/), or None
    outside git. The planner is left out because a measured run never reaches its sizing: every run the benchmark
    measures is planned under --max-memory, below the memory free, where no stage lowers its config's sizes."""
    root = Path(__file__).resolve().parents[1]
    try:
        listing = subprocess.run(["git", "ls-tree", "-r", sha, "--", *MEASURED_CODE], cwd=root, capture_output=True,
                                 text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    kept = [line for line in listing.splitlines() if "\tsrc/arithmech/plan/" not in line]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest() if kept else None


def _resumed(path: Path | None, sha: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The kept measurements whose commit measured the same code as `sha` (the same commit outside git); a circuit
    run kept without the shared prefix its plan needs is measured again."""
    if path is None or not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    codes = {r.get("git_sha"): measured_code(r["git_sha"]) for r in rows if r.get("git_sha") not in (None, "unknown")}
    code = measured_code(sha)
    return {(r["preset"], r["layers"], r["dtype"], r["stage"]): r["row"] for r in rows
            if r["row"]["status"] == "measured" and (r["stage"] != "circuit" or "shared_tokens" in r["row"])
            and (r.get("git_sha") == sha or (code is not None and codes.get(r.get("git_sha")) == code))}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(SKELETON_PRESETS), help="comma-separated presets")
    parser.add_argument("--layers", default="2,4", help="comma-separated depths of each skeleton")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated dtypes")
    parser.add_argument("--stages", default=",".join(KEYS), help="comma-separated runs (skeleton_stages.KEYS)")
    parser.add_argument("--quick", action="store_true", help="tiny widths of the same proportions (seconds)")
    parser.add_argument("--plan-only", action="store_true", help="print each run's plan and estimate, build nothing")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--device-profile", default=None, help="time estimates' profile; default: the device's")
    parser.add_argument("--max-memory", default=None, help="skip runs planned above it; default: 90%% of free now")
    parser.add_argument("--resume", type=Path, default=None, help="JSON lines of finished runs, kept and reused")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    presets = _names(args.presets, SKELETON_PRESETS, "preset")
    dtypes = _names(args.dtypes, tuple(DTYPE_BYTES), "dtype")
    runs = selected_runs(_names(args.stages, KEYS, "stage run"))
    depths = [int(n) for n in args.layers.split(",") if n.strip()]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda needs a CUDA GPU")
    args.device_profile = args.device_profile or profile_for(args.device)
    budget = parse_size(args.max_memory) if args.max_memory else int(FREE_SHARE * free_memory(args.device))
    sha = git_sha() or "unknown"
    done = _resumed(args.resume, sha)
    if args.resume is not None:
        args.resume.parent.mkdir(parents=True, exist_ok=True)
    device = profile_label(args.device_profile, args.device)
    print(f"{len(presets) * len(depths) * len(dtypes)} skeletons x {len(runs)} runs; memory above the weights "
          f"(planned against the allocator's peak), time estimated for {device}; runs planned above "
          f"{format_size(budget)} are skipped", flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    widest: dict[str, int] = {}
    start = time.perf_counter()
    for preset in presets:
        for layers in depths:
            for dtype in dtypes:
                for row in skeleton_rows(preset, layers, dtype, runs, args, budget, widest, done):
                    rows.append(row)
                    print(_line(row), flush=True)
                    key = (row["preset"], row["layers"], row["dtype"], row["stage"])
                    if args.resume is not None and row["status"] == "measured" and key not in done:
                        with args.resume.open("a") as handle:
                            handle.write(
                                json.dumps(
                                    {
                                        "preset": key[0],
                                        "layers": key[1],
                                        "dtype": key[2],
                                        "stage": key[3],
                                        "git_sha": sha,
                                        "row": row,
                                    }
                                )
                                + "\n"
                            )
    growth = layer_growth(rows)
    for g in growth:
        print(
            f"{g['preset']} {g['dtype']} {g['stage']}: per layer {g['layers'][0]} -> {g['layers'][1]}: planned "
            f"{format_size(g['planned_per_layer'])}, measured {format_size(g['measured_per_layer'])}"
        )
    how = (
        "planned"
        if args.plan_only
        else (
            "CUDA allocator's peak"
            if args.device.startswith("cuda")
            else "CPU allocator's peak (torch.profiler memory records); process RSS beside"
        )
    )
    metrics = summary(rows, growth, how)
    print(
        f"{metrics['runs_measured']} runs measured ({metrics['runs_within_tolerance']} planned within "
        f"{TOLERANCE:.0%}), {metrics['runs_skipped']} skipped, {metrics['runs_failed']} failed in "
        f"{time.perf_counter() - start:.0f} s"
    )
    if not args.plan_only:
        record("plan_skeletons", args, metrics)
    return metrics


if __name__ == "__main__":
    main()
