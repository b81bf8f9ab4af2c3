"""Checks of paths before the model loads: a wrong path fails in a second, not after minutes of loading.

Background
    Loading a 7B model takes minutes; an --out that is a file, a folder that cannot be written (under /proc,
    read-only), a misspelt --prompts or --data-dir, or a --from that is no identify run would otherwise fail
    only after it (and the reference set) were computed, with a chain of tracebacks. Every command calls these
    checks with the paths it was given, before it loads the model, and `arithmech run` calls them for every
    stage it will run. Each failure is one ConfigError sentence (exit status 2) naming the option and the fix;
    nothing is written.

Checks
    `out_folder`    not a file, creatable and writable (probed with a temporary file, removed at once), and
                    not a folder another stage's results live in: knockout --out into an identify run would
                    replace its metadata.json, identify --out at the top of an `arithmech run` folder would hide
                    its run from the report; nor the root of a run made stage by stage (`am.identify(...,
                    out="runs/quick/identify")`), whose stages live in subfolders.
    `input_file`    exists and is a file that can be opened; `input_folder` exists and is a folder (holding
                    the files named, when given).
    `stage_paths`   every path setting of a stage config: files, folders, identify runs (`lineage.identify_folder`,
                    which also finds the identify/ inside an `arithmech run` folder), .jsonl benchmark files;
                    then the content of the files it reads (the config's `check_files`: a prompt or templates
                    file, a benchmark, training or general-text file, read as the stage reads it), so JSON that
                    does not parse, an empty file, a missing field or an answer that is no number fails now.
                    Checks that need the tokenizer (an answer of one token) stay with the stage; log lines of
                    these reads are held back, as the stage's own read logs them.
    Paths starting with ~ are expanded (a shell does not expand --out=~/runs/x), and the checked path is
    returned for the command to use.

Usage
    >>> cfg, out = check(cfg, args.out, "knockout")   # in a command, before it loads the model
    >>> cfg = stage_paths(cfg, prefix="knockout")     # a config file's stage: knockout.from_run in messages
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from arithmech import run_lock
from arithmech.errors import ConfigError
from arithmech.lineage import identify_folder, read_metadata, refuse_answer_digits
from arithmech.runs import STAGE_FOLDERS

FILE_FIELDS = ("prompts_file", "templates_file", "train_file", "general_text", "circuit_file")
FOLDER_FIELDS = {"data_dir": (), "harness_include_path": (), "adapter": ("adapter_config.json",)}
"""Folder settings, with the files each must hold (a peft adapter folder has its adapter_config.json)."""
RUN_FIELDS = ("from_run", "sources", "identify_run")
FLAGS = {"from_run": "--from", "sources": "--from", "identify_run": "--identify", "prompts_file": "--prompts",
         "templates_file": "--templates"}  # fmt: skip
"""CLI option of a setting whose name differs from --field-name."""
SUBFOLDERS = {"analyze_attention": "attention", "analyze-mlp": "mlp", "analyze-fourier": "fourier",
              "analyze-numbers": "numbers",
              "mediate": "mediation", "pipeline": "run"}  # fmt: skip
"""The folder name of a stage's results (its name in a run folder and the report), where it differs from the
stage's name in metadata.json."""
DELTA_FILES = ("delta.json", "delta.safetensors")
"""What a finetune output folder holds for `evaluate --delta` (finetune/delta.py writes them)."""


def _writable(folder: Path, option: str, path: Path) -> None:
    try:
        fd, probe = tempfile.mkstemp(prefix=".arithmech-write-check-", dir=folder)
    except OSError as err:
        raise ConfigError(
            f"{option} {str(path)!r} cannot be written ({err.strerror or err}); choose a folder you can write to"
        ) from None
    os.close(fd)
    os.unlink(probe)


def out_folder(path: str | os.PathLike[str], option: str = "--out", stage: str | None = None) -> Path:
    """`path` (~ expanded) once it is checked as an output folder for `stage` (its metadata.json "stage", or
    "pipeline" for `arithmech run`); nothing is created."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{option} {str(out)!r} is a file; give a folder (it is created when missing)")
    existing = next(p for p in (out, *out.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise ConfigError(f"{option} {str(out)!r} cannot be created: {str(existing)!r} is a file; give another folder")
    _writable(existing, option, out)
    if out.is_dir() and stage is not None:
        _not_another_stages(out, option, stage)
    return out


def _not_another_stages(out: Path, option: str, stage: str) -> None:
    """Refuse an output folder that holds another stage's results, or (for one stage) an `arithmech run` folder."""
    subfolder = str(out / SUBFOLDERS.get(stage, stage))
    if stage != "pipeline" and (out / "pipeline.json").is_file():
        raise ConfigError(
            f"{option} {str(out)!r} is the folder of `arithmech run`, whose stages live in subfolders; give "
            f"{option} a subfolder, e.g. {subfolder!r}"
        )
    try:
        metadata = read_metadata(out)
    except ConfigError:
        return  # unreadable results are replaced by the new ones, as a rerun of the same stage replaces them
    held = [name for name in STAGE_FOLDERS if (out / name / "metadata.json").is_file()]
    if metadata is None and stage != "pipeline" and held:
        raise ConfigError(
            f"{option} {str(out)!r} is the root of a run whose stages live in subfolders ({', '.join(held)}); give "
            f"{option} a subfolder, e.g. {subfolder!r}"
        )
    found = None if metadata is None else metadata.get("stage")
    if found is not None and found != stage:
        own = "give `arithmech run` a folder of its own" if stage == "pipeline" else "give a folder of its own"
        raise ConfigError(
            f"{option} {str(out)!r} holds the results of the {found} stage, which writing there would replace; "
            f"{own}, e.g. {subfolder!r}"
        )


def input_file(path: str | os.PathLike[str], option: str) -> Path:
    """`path` (~ expanded) once it is an existing file that can be opened."""
    source = Path(path).expanduser()
    if not source.exists():
        raise ConfigError(f"{option} {str(source)!r} does not exist; check the path")
    if source.is_dir():
        raise ConfigError(f"{option} {str(source)!r} is a folder; give the path of a file")
    try:
        source.open("rb").close()
    except OSError as err:
        raise ConfigError(
            f"{option} {str(source)!r} cannot be read ({err.strerror or err}); check its permissions"
        ) from None
    return source


def input_folder(path: str | os.PathLike[str], option: str, holds: tuple[str, ...] = (), what: str = "") -> Path:
    """`path` (~ expanded) once it is an existing folder holding the files `holds` (`what` names such a folder)."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ConfigError(f"{option} {str(folder)!r} does not exist; check the path")
    if not folder.is_dir():
        raise ConfigError(f"{option} {str(folder)!r} is a file; give a folder")
    missing = [name for name in holds if not (folder / name).is_file()]
    if missing:
        raise ConfigError(f"{option} {str(folder)!r} holds no {missing[0]}; give {what or 'the right folder'}")
    return folder


def delta_folder(path: str | os.PathLike[str]) -> Path:
    """The finetune output folder of `evaluate --delta` (or a file in it), checked."""
    folder = Path(path).expanduser()
    folder = folder.parent if folder.is_file() else folder
    return input_folder(folder, "--delta", DELTA_FILES, "the output folder of finetune")


def _is_jsonl(name: Any) -> bool:
    return str(name).endswith((".jsonl", ".jsonl.gz"))  # as data/locate.py's is_jsonl_path


def _option(name: str, prefix: str | None) -> str:
    return f"{prefix}.{name}" if prefix else FLAGS.get(name, "--" + name.replace("_", "-"))


def stage_paths(cfg: Any, prefix: str | None = None, skip: frozenset[str] = frozenset()) -> Any:
    """`cfg` with each path setting checked and ~ expanded (identify runs become their identify folder), and the
    content of the files it reads checked.

    Messages name the CLI option (--from, --data-dir), or "<prefix>.<field>" for a config file's stage;
    fields in `skip` (those `arithmech run` fills in itself) are left alone.
    """
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(cfg):
        name, value = field.name, getattr(cfg, field.name)
        if name in skip or value is None or value == ():
            continue
        option = _option(name, prefix)
        if name in FILE_FIELDS:
            changes[name] = str(input_file(value, option))
        elif name in FOLDER_FIELDS:
            what = "a peft LoRA adapter folder" if name == "adapter" else ""
            changes[name] = str(input_folder(value, option, FOLDER_FIELDS[name], what))
        elif name in ("from_run", "identify_run"):
            changes[name] = str(identify_folder(value, option))
        elif name == "sources":
            changes[name] = tuple(str(identify_folder(v, option)) for v in value)
        elif name in ("benchmarks", "data"):  # set names, or .jsonl files of one's own
            items = [str(input_file(v, option)) if _is_jsonl(v) else v for v in ([value] if name == "data" else value)]
            changes[name] = items[0] if name == "data" else tuple(items)
    cfg = dataclasses.replace(cfg, **changes) if changes else cfg
    if hasattr(cfg, "check_files"):
        with logs_held_back():
            cfg.check_files()
    return cfg


@contextmanager
def logs_held_back(*names: str) -> Iterator[None]:
    """The info and warning lines of the loggers `names` (default arithmech's) dropped: a file read now is read (and
    logged) again by its stage."""
    logs = [logging.getLogger(name) for name in names or ("arithmech",)]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


def check(cfg: Any, out: str | os.PathLike[str], stage: str) -> tuple[Any, Path]:
    """What a command checks before it loads the model: its config's paths and its output folder, which it then
    locks against a second run into it (`run_lock`)."""
    checked, folder = stage_paths(cfg), out_folder(out, stage=stage)
    run_lock.hold(folder)
    return checked, folder


def check_reading(
    run_dir: str | os.PathLike[str], out: str | os.PathLike[str], stage: str, one_answer_token: bool = True
) -> tuple[Path, Path]:
    """The same for a command given its identify run apart from its config (an analysis of one answer token per
    prompt refuses a run of --answer-digits): (the identify folder, the output folder)."""
    folder = identify_folder(run_dir)
    if one_answer_token:
        refuse_answer_digits(folder, stage.replace("_", " ").replace("-", " "))
    out_dir = out_folder(out, stage=stage)
    run_lock.hold(out_dir)
    return folder, out_dir
