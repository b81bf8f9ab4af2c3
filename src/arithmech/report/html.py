"""`arithmech report RUN_DIR`: one self-contained HTML page with every figure and table of a run.

What it shows
    A header (model, dims, when the run was made, git sha, arithmech version), a table of contents, then one
    section per stage in pipeline order: identify (path-patching heatmap, top heads and MLPs), knockout
    (effect-rank vs random-rank curves), transfer (source x target matrix), attention roles, MLP logit lens,
    Fourier features, causal mediation, method agreement, neurons (specialisation, CNA neurons, pruning, LoRA),
    heuristic neurons, the edge-level circuit (faithfulness curves, CPR and CMD, the circuit drawn inline as
    SVG with tooltips), fine-tuning and evaluation (base vs tuned). Each section has its figures, a compact
    table of the numbers behind them and a one-paragraph reading written from those numbers. A footer lists
    the stage timings.

Rules
    The report only reads the run folder: it never recomputes a number and never loads a model. A stage
    without a folder says "not run" and one whose folder has no metadata.json says "did not finish"; an
    analysis computed from an earlier identify run than the one in the folder says "stale", with a banner
    that says why and how to refresh it. None of them shows numbers. A finished folder whose files cannot be
    read says so, with the reason, and the rest of the report is still written. Figures are the stages' own
    PNGs, embedded as base64, and the circuit drawing is its own SVG inline, so the page needs no network and
    no other file (report/page.py); the written file is atomic (runs.atomic_write_text).
    Both run layouts are read (report/run_folder.py): `arithmech run` folders and the flat folders of
    separate commands (identify's files in the run folder, `--from` stages in subfolders).

Usage
    >>> write_report("runs/demo")                  # -> runs/demo/report.html
    >>> write_report("runs/demo", "paper/demo.html")
"""

from __future__ import annotations

import csv
import errno
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arithmech.errors import ConfigError
from arithmech.report.circuit_section import circuit_body
from arithmech.report.fourier_section import fourier_body
from arithmech.report.heuristics_section import heuristics_body
from arithmech.report.knockout_section import knockout_body
from arithmech.report.numbers_section import numbers_body
from arithmech.report.page import Body, Section, Table, num, render_page
from arithmech.report.run_folder import DONE, STALE, RunFolder, StageFolder, open_run
from arithmech.report.sections import attention_body, identify_body, mlp_body, transfer_body
from arithmech.report.sections_mechanisms import (
    agreement_body,
    evaluate_body,
    finetune_body,
    mediation_body,
    neurons_body,
)
from arithmech.runs import atomic_write_text

logger = logging.getLogger(__name__)

SECTIONS: tuple[tuple[str, str, Callable[[StageFolder], Body]], ...] = (
    ("identify", "Key components (path patching)", identify_body),
    ("knockout", "Knockout: effect-rank vs random-rank", knockout_body),
    ("transfer", "Transfer to other tasks", transfer_body),
    ("attention", "Attention roles of the key heads", attention_body),
    ("mlp", "MLP logit lens", mlp_body),
    ("fourier", "Fourier features of the number tokens", fourier_body),
    ("mediation", "Causal mediation", mediation_body),
    ("agreement", "Method agreement", agreement_body),
    ("neurons", "Neurons: comparative neuron analysis and pruning", neurons_body),
    ("heuristics", "Heuristic neurons over the operand grid", heuristics_body),
    ("numbers", "How the operands are represented (helix, circles, line, digits)", numbers_body),
    ("circuit", "Edge-level circuit, scored by faithfulness (MIB)", circuit_body),
    ("finetune", "Fine-tuning", finetune_body),
    ("evaluate", "Evaluation: base vs tuned", evaluate_body),
)
"""(stage, section title, builder) in pipeline order."""

UNREADABLE = "could not be read"


def build_section(stage: StageFolder, title: str, builder: Callable[[StageFolder], Body]) -> Section:
    """One section; a finished folder with malformed or missing files becomes a note, not a crash."""
    if stage.status == STALE:
        note = (f"STALE: these {stage.name} results are not shown, because {stage.stale}: identify was run again "
                f"after them. Rerun the {stage.name} stage on this identify run to refresh them (it says which "
                "folder it read).")  # fmt: skip
        return Section(stage.name, title, STALE, folder=stage.path, note=note)
    if stage.status != DONE:
        return Section(stage.name, title, stage.status, folder=stage.path)
    try:
        if not isinstance(stage.json("metadata.json"), dict):
            raise ValueError("metadata.json is not a JSON object")
        return Section(stage.name, title, DONE, builder(stage), stage.path)
    except (OSError, KeyError, ValueError, IndexError, TypeError, StopIteration, csv.Error) as err:
        reason = f"{type(err).__name__}: {err}"
        logger.warning("report: the %s folder %s could not be read (%s)", stage.name, stage.path, reason)
        note = (f"The {stage.name} folder is finished but its files could not be read ({reason}); it may come from "
                "another arithmech version. Rerun the stage to refresh it.")  # fmt: skip
        return Section(stage.name, title, UNREADABLE, folder=stage.path, note=note)


def _first(run: RunFolder, *keys: str) -> Any:
    """The first value of a nested metadata key among the finished stages, in pipeline order."""
    for stage in run.present():
        value: Any = stage.metadata if stage.status == DONE else {}
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value not in (None, "", {}):
            return value
    return None


def _model_name(run: RunFolder) -> str:
    model = _first(run, "model") or {}
    name = model.get("model") or run.pipeline.get("model", {}).get("model")
    return str(name) if name else "built-in default model"


def header_facts(run: RunFolder) -> list[tuple[str, str]]:
    """Model, dims, dates, provenance: what a reader needs to know which run this is."""
    model = _first(run, "model") or {}
    dims = _first(run, "dims") or {}
    created = sorted(
        str(s.metadata.get("created")) for s in run.present() if s.status == DONE and s.metadata.get("created")
    )
    finished = sorted(str(r.get("finished")) for r in run.pipeline.get("stages", {}).values() if r.get("finished"))
    dates = finished or created
    shas: dict[str, list[str]] = {}
    for stage in run.present():
        sha = stage.metadata.get("git_sha") if stage.status == DONE else None
        if sha:
            shas.setdefault(str(sha), []).append(stage.name)
    sha_text = "; ".join(f"{sha[:12]} ({', '.join(names)})" if len(shas) > 1 else sha for sha, names in shas.items())
    versions = _first(run, "versions") or {}
    from arithmech import __version__

    facts = [
        ("model", _model_name(run)),
        ("source", str(model.get("gguf_file") or model.get("loaded_from") or model.get("model") or "n/a")
                   + (" (GGUF, converted to float32; quantized weights keep their rounding)" if model.get("gguf_file")
                      else "")),
        ("architecture", f"{model.get('model_type', 'n/a')}, {dims.get('n_layers', '?')} layers x "
                         f"{dims.get('n_heads', '?')} heads, d_model {dims.get('d_model', '?')}, "
                         f"{model.get('dtype', '?')} on {model.get('device', '?')}"),
        ("run folder", f"{run.path} ({run.layout} layout)"),
        ("run date", f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else (dates[0] if dates else "n/a")),
        ("git sha", sha_text or "n/a (not a git checkout)"),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "n/a"),
        ("report written", f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} by arithmech {__version__}"),
    ]  # fmt: skip
    return facts


def _timings(metadata: dict[str, Any]) -> str:
    timings = metadata.get("timings", {})
    if not isinstance(timings, dict):
        return ""
    return ", ".join(f"{k.removesuffix('_s')} {num(v)} s" for k, v in timings.items() if isinstance(v, int | float))


def timings_table(run: RunFolder) -> Table:
    """Per stage: status, seconds and finish time from pipeline.json, and the stage's own timings."""
    rows = []
    for name, _, _ in SECTIONS:
        stage = run.stage(name)
        record = stage.record
        metadata = stage.metadata if stage.status == DONE else {}
        seconds = record.get("seconds")
        rows.append((
            name, stage.status, num(seconds) if seconds is not None else "n/a",
            str(record.get("finished") or metadata.get("created") or "n/a"), _timings(metadata),
        ))  # fmt: skip
    return Table("Stage timings (seconds from pipeline.json; the stage's own timings from its metadata.json)",
                 ("stage", "status", "seconds", "finished", "timings"), rows)  # fmt: skip


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of a run folder (default <run>/report.html) and return its path."""
    run = open_run(run_dir)
    target = Path(out) if out is not None else run.path / "report.html"
    if target.is_dir():
        target = target / "report.html"
    sections = [build_section(run.stage(name), title, builder) for name, title, builder in SECTIONS]
    page = render_page(f"arithmech report: {_model_name(run)}", header_facts(run), sections, timings_table(run),
                       target.parent)  # fmt: skip
    try:
        atomic_write_text(target, page)
    except OSError as err:
        if err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise  # a full disk says so itself (cli.main)
        raise ConfigError(
            f"the report cannot be written to {str(target)!r} ({err.strerror or err}); write it elsewhere with "
            "--out, e.g. --out ~/report.html"
        ) from None
    logger.debug("report written to %s", target)
    return target
