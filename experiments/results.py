"""Refresh the committed results/ folders: run a study's commands, keep its small tables and their provenance.

    python experiments/results.py run demo                  # rerun a source (experiments/studies.py), then collect
    python experiments/results.py collect demo              # keep the files of runs/results/demo as they are
    python experiments/results.py collect arithmetic-sft --runs /path/to/scratch --seconds 14400
    python experiments/results.py list                      # the sources, their studies and commands

A refresh replaces the kept run folders of its source under results/<study>/<run>/ (each written to a staging
folder first, then moved in place) and its entry in results/<study>/study.json: the one command that regenerates
it, the commands it ran, the commit and whether the source tree had uncommitted changes, the model file's sha256,
when, and the wall time measured by `run` (or given with --seconds). Then render the pages
(`python experiments/render_results.py --write`) and commit results/, docs/results.md and README.md together.
Only small tables are kept (CSV/JSON under MAX_BYTES each); a larger file is refused, not truncated.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from studies import SOURCES, Kept, Source

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
FIGURES = ROOT / "docs" / "figures"
SCRATCH = ROOT / "runs" / "results"
MAX_BYTES = 256 * 1024
"""The largest file kept: results/ holds the tables the text quotes, not activations or checkpoints."""
KEPT_SUFFIXES = (".csv", ".json")


def command_line(source: Source) -> str:
    return f"python experiments/results.py run {source.name}"


def argv_of(command: str, runs: Path, model: str | None) -> list[str]:
    """A registry command as argv: `arithmech` and `python` run under this interpreter."""
    argv = shlex.split(command.format(runs=runs, model=model))
    if argv[0] == "arithmech":
        return [sys.executable, "-m", "arithmech.cli", *argv[1:]]
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    return argv


def run_source(source: Source, runs: Path, quick_model: str | None = None, quiet: bool = False) -> float:
    """Run the source's commands (its `quick` ones on `quick_model`) into `runs`; the wall time in seconds."""
    commands = source.quick if quick_model else source.commands
    start = time.perf_counter()
    for command in commands:
        argv = argv_of(command, runs, quick_model)
        if quiet and argv[1:3] == ["-m", "arithmech.cli"]:
            argv.append("--quiet")
        elif not quiet:
            print("+ " + command.format(runs=runs, model=quick_model), flush=True)
        subprocess.run(argv, check=True, cwd=ROOT)
    return time.perf_counter() - start


def tree_state() -> dict[str, Any]:
    """The commit and whether src/, experiments/ or configs/ differ from it (then the results are not its)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "src", "experiments", "configs")
    return {"git_sha": git("rev-parse", "HEAD") or None, "uncommitted_changes": bool(changed)}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_record(metadata: dict[str, Any]) -> dict[str, Any]:
    """The model a run read and the sha256 of its weights' file(s) (the GGUF file's, or a folder's weight files)."""
    source = metadata.get("model") or {}
    record: dict[str, Any] = {"model": source.get("model")}
    if source.get("gguf_sha256"):
        record["sha256"] = source["gguf_sha256"]
        return record
    folder = Path(str(source.get("loaded_from") or source.get("model") or ""))
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")) if folder.is_dir() else []
    if weights:
        digest = hashlib.sha256("".join(file_sha256(w) for w in weights).encode())
        record["sha256"] = digest.hexdigest()
    return record


def keep(kept: Kept, runs: Path, results: Path) -> dict[str, Any] | None:
    """Copy one run folder's kept files (and metadata.json) into results/<study>/<name>/; its metadata."""
    folder = runs / kept.path
    names = [*kept.files, *(["metadata.json"] if kept.metadata else [])]
    for name in names:
        path = folder / name
        if not path.is_file():
            raise SystemExit(f"{path} is missing: the source did not write it (rerun it with `run`)")
        if path.suffix not in KEPT_SUFFIXES or path.stat().st_size > MAX_BYTES:
            raise SystemExit(f"{path} is not a small table (CSV/JSON under {MAX_BYTES // 1024} KiB); keep less")
    target = results / kept.study / kept.name
    staging = target.with_name(f".{kept.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in names:
        shutil.copyfile(folder / name, staging / name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return json.loads((folder / "metadata.json").read_text()) if kept.metadata else None


def collect(
    source: Source,
    runs: Path,
    results: Path,
    seconds: float | None,
    quick: bool = False,
    state: dict[str, Any] | None = None,
) -> list[str]:
    """Keep the source's files from `runs` and record its provenance in each study.json (`state`: the tree when
    the run started, default now); the studies touched."""
    metadata = [m for kept in source.kept if (m := keep(kept, runs, results)) is not None]
    record = {
        "command": command_line(source),
        "commands": list(source.quick if quick else source.commands),
        **(state or tree_state()),
        "model": model_record(metadata[0]) if metadata else None,
        "seconds": None if seconds is None else round(seconds),
        "collected": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if not quick:
        for figure, name in source.figures:
            shutil.copyfile(runs / figure, FIGURES / name)
    touched = list(dict.fromkeys(kept.study for kept in source.kept))
    for study in touched:
        path = results / study / "study.json"
        entry = json.loads(path.read_text()) if path.is_file() else {"study": study, "sources": {}}
        entry["sources"][source.name] = record
        path.write_text(json.dumps(entry, indent=2) + "\n")
    return touched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("run", "collect", "list"))
    parser.add_argument("source", nargs="?", choices=sorted(SOURCES))
    parser.add_argument("--runs", type=Path, default=None, help="scratch folder (default runs/results/<source>)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default results/)")
    parser.add_argument("--seconds", type=float, default=None, help="collect: the wall time of the run, measured")
    args = parser.parse_args()
    if args.action == "list":
        for source in SOURCES.values():
            print(f"{source.name}: {', '.join(dict.fromkeys(k.study for k in source.kept))}")
            print("".join(f"    {c}\n" for c in source.commands))
        return
    if args.source is None:
        parser.error(f"name a source: {', '.join(SOURCES)}")
    source = SOURCES[args.source]
    runs = args.runs or SCRATCH / source.name
    seconds = args.seconds
    state = tree_state()
    if args.action == "run":
        if state["uncommitted_changes"]:
            print("warning: src/, experiments/ or configs/ have uncommitted changes; study.json will say so")
        seconds = run_source(source, runs)
    touched = collect(source, runs, args.results, seconds, state=state if args.action == "run" else None)
    print(f"kept in {', '.join(f'results/{s}' for s in touched)}; now python experiments/render_results.py --write")


if __name__ == "__main__":
    main()
