"""Finding a run's stage folders on disk, for reports that only read files.

Three layouts exist:

    pipeline   `arithmech run --out R`: R/pipeline.json and one subfolder per stage (R/identify, R/knockout, ...,
               R/evaluate/{base,tuned}).
    flat       separate commands: `arithmech identify --out R` writes identify's files into R itself, and
               `--from R` commands (knockout, attention, mlp, agreement, ...) write R/<stage> subfolders.
    stage      one stage's own folder, e.g. runs/heuristics-<time> of `arithmech analyze heuristics`.

A stage's folder is finished when its metadata.json exists (every stage writes it last): no folder means the
stage was not run, a folder without metadata.json means it did not finish. A finished analysis that records
another identify run than the one beside it (its fingerprint, `lineage.stale_reason`) is stale: identify was
run again since, so its numbers belong to an earlier run and are not shown as this run's.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arithmech.errors import ConfigError
from arithmech.lineage import identify_fingerprint, read_metadata, stale_reason
from arithmech.preflight import SUBFOLDERS
from arithmech.runs import STAGE_FOLDERS

DONE, NOT_RUN, UNFINISHED, STALE = "done", "not run", "did not finish", "stale"


@dataclass(frozen=True)
class StageFolder:
    """One stage's folder and its state; readers of its files raise OSError/KeyError/ValueError when malformed."""

    name: str
    path: Path | None
    status: str
    record: dict[str, Any] = field(default_factory=dict)
    """The stage's entry in pipeline.json (fingerprint, seconds, finished), when there is one."""
    stale: str = ""
    """Why the folder's results are not those of the identify run beside it (status STALE), else empty."""

    @property
    def folder(self) -> Path:
        if self.path is None:
            raise ConfigError(f"stage {self.name!r} was not run, so it has no folder")
        return self.path

    def has(self, name: str) -> bool:
        return self.path is not None and (self.path / name).is_file()

    def json(self, name: str = "metadata.json") -> Any:
        return json.loads((self.folder / name).read_text())

    def csv(self, name: str) -> list[dict[str, str]]:
        with (self.folder / name).open(newline="") as handle:
            return list(csv.DictReader(handle))

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:
        """metadata.json, or {} when absent or not a JSON object (the section then says why it can't be read)."""
        try:
            value = self.json() if self.has("metadata.json") else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class RunFolder:
    """A run folder: its layout, pipeline.json (if any) and every stage's folder."""

    path: Path
    layout: str
    """"pipeline" or "flat"."""
    pipeline: dict[str, Any]
    stages: dict[str, StageFolder]

    def stage(self, name: str) -> StageFolder:
        return self.stages[name]

    def present(self) -> list[StageFolder]:
        return [s for s in self.stages.values() if s.status != NOT_RUN]


def _is_identify_folder(path: Path) -> bool:
    """identify's files sit in `path` itself (the flat layout)."""
    if (path / "metadata.json").is_file():
        try:
            return json.loads((path / "metadata.json").read_text()).get("stage") == "identify"
        except (OSError, ValueError, AttributeError):
            return False
    return (path / "effects.csv").is_file() and (path / "key_components.json").is_file()


def _stage_alone(path: Path) -> str | None:
    """The report stage whose own finished folder `path` is (its metadata.json names it), else None."""
    try:
        metadata = read_metadata(path)
    except ConfigError:
        return None
    stage = str((metadata or {}).get("stage"))
    name = SUBFOLDERS.get(stage, stage)
    return name if name in STAGE_FOLDERS and name != "identify" else None


def _status(path: Path) -> str:
    return DONE if (path / "metadata.json").is_file() else UNFINISHED


def open_run(run_dir: str | Path) -> RunFolder:
    """Read which stages a run folder holds; ConfigError when it is missing or holds none."""
    path = Path(run_dir)
    if path.is_file():
        raise ConfigError(f"{str(path)!r} is a file, not a run folder; give the folder that holds it, "
                          f"e.g. `arithmech report {path.parent}`")  # fmt: skip
    if not path.is_dir():
        raise ConfigError(f"run folder {str(path)!r} does not exist; give the --out folder of `arithmech run`")
    pipeline: dict[str, Any] = {}
    if (path / "pipeline.json").is_file():
        try:
            pipeline = json.loads((path / "pipeline.json").read_text())
        except ValueError:
            raise ConfigError(f"{str(path / 'pipeline.json')!r} is not valid JSON; rerun `arithmech run`") from None
    records = pipeline.get("stages", {}) if isinstance(pipeline, dict) else {}
    flat = not (path / "identify").is_dir() and _is_identify_folder(path)
    alone = None if flat else _stage_alone(path)
    stages: dict[str, StageFolder] = {}
    for name in STAGE_FOLDERS:
        folder = path if (name == "identify" and flat) or name == alone else path / name
        if (name == "identify" and flat) or name == alone:
            status = _status(path)
        elif folder.is_dir():
            status = _status(folder)
        else:
            stages[name] = StageFolder(name, None, NOT_RUN, records.get(name, {}))
            continue
        stages[name] = StageFolder(name, folder, status, records.get(name, {}))
    _mark_stale(stages)
    run = RunFolder(path, "flat" if flat else "stage" if alone else "pipeline", pipeline, stages)
    if not run.present():
        raise ConfigError(
            f"run folder {str(path)!r} holds no stage folders ({', '.join(STAGE_FOLDERS)}); "
            "give the --out folder of `arithmech run`, of `arithmech identify` or of one stage"
        )
    return run


def _mark_stale(stages: dict[str, StageFolder]) -> None:
    """Give every finished analysis made from another identify run than the finished one beside it STALE."""
    identify = stages["identify"]
    if identify.status != DONE:
        return
    current, created = identify_fingerprint(identify.folder), identify.metadata.get("created")
    for name, stage in stages.items():
        reason = stale_reason(stage.metadata, current, created) if name != "identify" and stage.status == DONE else None
        if reason:
            stages[name] = dataclasses.replace(stage, status=STALE, stale=reason)
