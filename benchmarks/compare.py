"""`make bench`: run the benchmarks at a fixed size and compare with the previous results in the repo.

The suite (scripts, their quick and full sizes, how each measurement is judged) is declared in `suite.py`.
Each script records its measurements through `record.py`. Ratios measured within one run (speedups, agreement
scores) do not depend on the machine and are always compared; absolute times, rates and memory only against
results from the same machine (CPU model, logical cores, torch version, device). A measurement more than
--tolerance percent worse than the previous one fails the run (exit status 1); so does a correctness check
(largest |difference| between the two methods, accuracies agree) that breaks, whatever the speed.

    python benchmarks/compare.py                        # the CPU benchmarks, about 6 min on 2 idle cores
    python benchmarks/compare.py --only knockout,mediation
    python benchmarks/compare.py --update               # accept these results: make bench-update, then commit
    python benchmarks/compare.py --full --update        # the docs' full sizes, about 15 min: make bench-full-update
    python benchmarks/compare.py --device cuda          # the same on a GPU, plus gpu_scan.py and gpu_finetune.py
    python benchmarks/compare.py --full --only plan_skeletons,skeleton_numerics --update   # on demand only (hours)

results.json holds the last accepted entry of each benchmark at each size, with its command, machine, date and
git sha; the Performance tables of docs/performance.md and the README's speed paragraph are rendered from it
(`readme_tables.py --write`, which the make targets run after --update), and the skeletons' tables of
docs/guides/scale.md too (`scale_tables.py --write`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from record import RECORD_ENV
from suite import BENCHMARKS, SIZES, Benchmark, Check, Performance, Size

from arithmech.runs import atomic_write_json, git_sha

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results.json"
HEARTBEAT_S = 60
"""How often a running benchmark's elapsed time is printed."""


@dataclass(frozen=True)
class Row:
    """One line of the comparison table."""

    benchmark: str
    metric: str
    previous: Any
    now: Any
    change_pct: float | None
    verdict: str
    failed: bool = False
    broken: bool = False
    """A correctness failure, which --update does not accept."""


class BenchmarkFailed(Exception):
    """A benchmark script exited with an error or recorded nothing."""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_threads() -> int:
    """The CPU threads each benchmark script's torch uses (OMP_NUM_THREADS, which the scripts inherit)."""
    import torch

    return torch.get_num_threads()


def machine_fingerprint(device: str) -> dict[str, Any]:
    """What absolute times depend on; they are compared only between runs with equal fingerprints."""
    fingerprint: dict[str, Any] = {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "torch_threads": torch_threads(),
        "torch": importlib.metadata.version("torch"),
        "device": device,
    }
    if device.startswith("cuda"):
        import torch

        fingerprint["gpu"] = torch.cuda.get_device_name(device) if torch.cuda.is_available() else None
    return fingerprint


Results = dict[str, dict[str, dict[str, Any]]]
"""size -> benchmark -> entry (metrics, args, command, wall_s, machine, date, git sha)."""


def load_results(path: Path) -> Results | None:
    """The previous entry of each benchmark at each size, or None when there is no results file yet."""
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        unknown = set(stored) - {"written_by", *SIZES}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}, expected {', '.join(SIZES)}")
        return {size: dict(stored.get(size, {})) for size in SIZES}
    except (ValueError, TypeError) as err:
        sys.exit(f"{path} is not a results file of compare.py ({err}); restore it from git or delete it")


def write_results(path: Path, results: Mapping[str, Mapping[str, Any]]) -> None:
    """Store `results` (size -> benchmark -> entry) atomically."""
    atomic_write_json(path, {"written_by": "benchmarks/compare.py --update", **{s: dict(results[s]) for s in SIZES}})


def read_record(record_file: Path, name: str) -> dict[str, Any] | None:
    """The last line `name` appended to the record file, if any."""
    lines = record_file.read_text(encoding="utf-8").splitlines() if record_file.exists() else []
    found = [json.loads(line) for line in lines if line.strip()]
    return next((line for line in reversed(found) if line["benchmark"] == name), None)


def run_benchmark(bench: Benchmark, device: str, size: Size = "quick", bench_dir: Path = BENCH_DIR) -> dict[str, Any]:
    """Run one script in its own process; return its recorded entry plus command and wall time, echoing its output."""
    script_args = bench.script_args(device, size)
    command = [sys.executable, str(bench_dir / f"{bench.name}.py"), *script_args]
    with tempfile.TemporaryDirectory() as scratch:
        record_file, out_file, err_file = (Path(scratch) / n for n in ("record.jsonl", "stdout", "stderr"))
        env = {**os.environ, RECORD_ENV: str(record_file)}
        start = time.perf_counter()
        with out_file.open("w") as out, err_file.open("w") as err:
            process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=bench_dir.parent)
            while True:
                try:
                    process.wait(timeout=HEARTBEAT_S)
                    break
                except subprocess.TimeoutExpired:
                    print(f"    ... {bench.name} running, {_minutes(time.perf_counter() - start)}", flush=True)
        wall_s = time.perf_counter() - start
        for line in out_file.read_text(errors="replace").splitlines():
            print(f"    | {line}")
        stderr_tail = "its stderr ends:\n" + err_file.read_text(errors="replace")[-3000:]
        if process.returncode != 0:
            raise BenchmarkFailed(f"{bench.name} exited with status {process.returncode}; {stderr_tail}")
        entry = read_record(record_file, bench.name)
        if entry is None:
            raise BenchmarkFailed(f"{bench.name} recorded no metrics (does it call record()?); {stderr_tail}")
    shown = " ".join(["python", f"benchmarks/{bench.name}.py", *script_args])
    return {"metrics": entry["metrics"], "args": entry["args"], "command": shown, "wall_s": round(wall_s, 1)}


def _worse_fraction(kind: Performance, previous: float, now: float) -> float:
    """How much worse `now` is than `previous`, as a fraction of |previous| (negative: better)."""
    delta = previous - now if kind.higher_is_better else now - previous
    if previous == 0:
        return 0.0 if delta == 0 else math.copysign(math.inf, delta)
    return delta / abs(previous)


def compare_metric(
    bench: Benchmark, metric: str, now: Any, previous_entry: Mapping[str, Any] | None, now_entry: Mapping[str, Any],
    machine: Mapping[str, Any], tolerance: float,
) -> Row:  # fmt: skip
    """The verdict on one measurement against the previous entry of its benchmark (`tolerance` a fraction)."""
    kind = bench.metrics.get(metric)
    previous = (previous_entry or {}).get("metrics", {}).get(metric)
    change = None
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (now, previous))
    if numbers and previous:
        change = 100 * (now - previous) / abs(previous)
    if kind is None:
        return Row(bench.name, metric, previous, now, change, "not compared: not declared in compare.py")
    if now is None:
        return Row(bench.name, metric, previous, now, None, "FAIL: not recorded by the script", failed=True)
    if isinstance(kind, Check):
        if kind.holds(now):
            return Row(bench.name, metric, previous, now, change, f"ok ({kind.rule})")
        return Row(bench.name, metric, previous, now, change, f"FAIL: broken ({kind.rule})", failed=True, broken=True)
    if not isinstance(now, (int, float)) or not math.isfinite(now):
        return Row(bench.name, metric, previous, now, None, "FAIL: not a finite number", failed=True)
    if previous is None:
        return Row(bench.name, metric, None, now, None, "new: no previous result")
    if previous_entry is not None and previous_entry.get("args") != now_entry.get("args"):
        return Row(bench.name, metric, previous, now, change, "not compared: other arguments")
    if kind.same_machine_only and (previous_entry or {}).get("machine") != machine:
        return Row(bench.name, metric, previous, now, change, "not compared: other machine")
    worse = _worse_fraction(kind, previous, now)
    if worse > tolerance:
        return Row(bench.name, metric, previous, now, change, f"FAIL: {kind.worse}", failed=True)
    if worse < -tolerance:
        return Row(bench.name, metric, previous, now, change, "better")
    return Row(bench.name, metric, previous, now, change, "ok")


def compare(
    previous: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]],
    benchmarks: Sequence[Benchmark], machine: Mapping[str, Any], tolerance: float,
) -> list[Row]:  # fmt: skip
    """One row per declared or recorded measurement of each benchmark in `current` (`tolerance` a fraction)."""
    rows = []
    for bench in benchmarks:
        if bench.name not in current:
            continue
        entry = current[bench.name]
        recorded = entry["metrics"]
        names = [*bench.metrics, *(m for m in recorded if m not in bench.metrics)]
        for metric in names:
            rows.append(
                compare_metric(bench, metric, recorded.get(metric), previous.get(bench.name), entry, machine, tolerance)
            )
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return f"{len(value)} rows"
    return str(value)


def _change(pct: float | None) -> str:
    return "" if pct is None else f"{pct:+.1f}%"


def format_table(rows: Sequence[Row]) -> str:
    """Rows as aligned text columns: benchmark, metric, previous, now, change, verdict."""
    header = ("benchmark", "metric", "previous", "now", "change", "verdict")
    cells = [header] + [
        (r.benchmark, r.metric, _cell(r.previous), _cell(r.now), _change(r.change_pct), r.verdict) for r in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
        for line in cells
    )


def failure_sentence(rows: Sequence[Row], results: Path, tolerance_pct: float) -> str:
    """One sentence: which measurements regressed or broke, and how to accept a regression that is intended."""
    broken = [f"{r.benchmark} {r.metric}" for r in rows if r.broken]
    regressed = [r for r in rows if r.failed and not r.broken]
    worse = [f"{r.benchmark} {r.metric} ({r.verdict.removeprefix('FAIL: ')})" for r in regressed]
    parts = []
    if worse:
        parts.append(
            f"worse than {results} beyond the {tolerance_pct:g}% noise tolerance: {', '.join(worse)}; if that is "
            "expected (a deliberate trade-off; or a busy machine, so rerun it idle first), accept the new results "
            "with `make bench-update` and commit the results file"
        )
    if broken:
        parts.append(f"correctness broken, which `make bench-update` does not accept, so fix it: {', '.join(broken)}")
    return "Benchmark regression: " + "; ".join(parts) + "."


def select(only: str | None, device: str) -> list[Benchmark]:
    """The benchmarks to run: those named by --only, else all that the device can run and whose optional
    extra is installed (the others are named, with how to install it), but those run on demand only."""
    by_name = {b.name: b for b in BENCHMARKS}
    if only is None:
        runnable = [b for b in BENCHMARKS if (device.startswith("cuda") or not b.needs_cuda) and not b.on_demand]
        for bench in runnable:
            if bench.missing():
                print(f"{bench.name} left out: {', '.join(bench.missing())} not installed ({bench.install})")
        return [b for b in runnable if not b.missing()]
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        sys.exit(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(by_name)}")
    needing_cuda = [n for n in names if by_name[n].needs_cuda and not device.startswith("cuda")]
    if needing_cuda:
        sys.exit(f"{', '.join(needing_cuda)} needs a GPU; add --device cuda")
    lacking = [by_name[n] for n in names if by_name[n].missing()]
    if lacking:
        sys.exit("; ".join(f"{b.name} needs {', '.join(b.missing())}: {b.install}" for b in lacking))
    return [by_name[n] for n in names]


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="store this run's results as the new previous ones")
    parser.add_argument("--full", action="store_true", help="the full sizes the docs report instead of the quick ones")
    parser.add_argument("--only", default=None, help="comma-separated benchmark names (default: all)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the previous results file")
    parser.add_argument("--device", default="cpu", help="torch device passed to each benchmark")
    parser.add_argument("--tolerance", type=float, default=30.0, help="noise tolerance, percent worse than before")
    args = parser.parse_args(argv)

    benchmarks = select(args.only, args.device)
    size: Size = "full" if args.full else "quick"
    stored = load_results(args.results)
    previous = None if stored is None else stored[size]
    machine = machine_fingerprint(args.device)
    current: dict[str, dict[str, Any]] = {}
    script_failures = []
    started = time.perf_counter()
    for i, bench in enumerate(benchmarks, 1):
        took = (previous or {}).get(bench.name, {}).get("wall_s")
        shown = " ".join(bench.script_args(args.device, size))
        print(f"[{i}/{len(benchmarks)}] python benchmarks/{bench.name}.py {shown}"
              + (f" (previous run: {_minutes(took)})" if took else ""), flush=True)  # fmt: skip
        try:
            current[bench.name] = run_benchmark(bench, args.device, size)
        except BenchmarkFailed as err:
            print(f"FAILED: {err}", file=sys.stderr, flush=True)
            script_failures.append(bench.name)
            continue
        print(f"    done in {_minutes(current[bench.name]['wall_s'])} "
              f"(all so far: {_minutes(time.perf_counter() - started)})", flush=True)  # fmt: skip

    rows = compare(previous or {}, current, benchmarks, machine, args.tolerance / 100)
    if rows:
        print(f"\n{format_table(rows)}\n")
    if script_failures:
        print(f"Benchmark script failed: {', '.join(script_failures)} (its stderr is above).")
    runs_are_sound = not script_failures and not any(r.broken for r in rows)
    if args.update and runs_are_sound:
        stamp = {"machine": machine, "date": datetime.date.today().isoformat(), "git_sha": git_sha()}
        entries = {**(previous or {}), **{n: {**e, **stamp} for n, e in current.items()}}
        write_results(args.results, {**(stored or {s: {} for s in SIZES}), size: entries})
        print(f"stored as the {size}-size results in {args.results}; render docs/performance.md's tables and the "
              "README's speed paragraph from it (`python benchmarks/readme_tables.py --write`, which the make targets "
              "run) and commit the three")
        return 0
    if args.update:
        print(f"{args.results} not written: every benchmark must run and pass its correctness checks first.")
    elif previous is None and runs_are_sound:
        print(f"no previous results ({args.results} does not exist); store these with `make bench-update` "
              "(compare.py --update; add --full for the full size)")  # fmt: skip
        return 0
    if any(r.failed for r in rows):
        print(failure_sentence(rows, args.results, args.tolerance))
    if script_failures or any(r.failed for r in rows):
        return 1
    print(f"no measurement is worse than {args.results} beyond the {args.tolerance:g}% noise tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
