"""Which identify run an analysis read: fingerprints, finding a run's identify folder, stale analyses.

Background
    knockout, transfer, analyze attention / mlp / fourier, agreement, precise finetune and the circuit stage's
    path-patching ranking read an identify run folder: its ranking (effects.csv, key_components.json) and its
    reference prompts (prompts.jsonl). When identify runs
    again into the same folder, an analysis written before it holds the numbers of the earlier run, and a
    report that puts them under the new heads is silently wrong. So every analysis records the fingerprint
    of the identify run it read, and a reader compares it with the run beside it.

Fingerprint
    sha256 of the three files the analyses read, effects.csv, key_components.json and prompts.jsonl (16 hex
    digits). A rerun with the same settings that gives another result (another model revision, an edited
    --prompts file, other float rounding) has another fingerprint; a bit-identical rerun has the same one, so
    its analyses stay valid. identify writes it into its metadata.json too; readers recompute it from the files.

Record
    `identify_record(folder)` -> {"path", "fingerprint", "created"}. Every stage writes the list of the identify
    runs it read as the `identify_runs` key of its metadata.json: one record for an analysis, one per source for
    transfer, an empty list for a stage that reads none (identify, mediate, evaluate, ...). So the record alone
    says what an analysis depends on, and a reader of run folders needs to know nothing about stages.

Finding the folder (`identify_folder`)
    The folder itself when it is a finished identify run (metadata.json with stage "identify"); the top of an
    `arithmech run` folder gives its identify/ (logged); a folder holding exactly one finished identify run
    gives that one. Anything else is one ConfigError that says what the folder is and which one to give.

Stale analyses
    `stale_reason(metadata, fingerprint, created)`: why an analysis does not belong to the identify run with
    that fingerprint (None when it does, or when its record says it read none). Records written on
    2026-12-01 hold one run (or null) as `identify_run` instead, and are read the same way. A record that says
    nothing (made before fingerprints were recorded) is stale when it is older than the identify run: it cannot
    show that it belongs to it. identify moves stale analyses aside before writing, never deleting them
    (`move_aside_stale`); `arithmech report` shows them as stale.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from arithmech.errors import ConfigError

logger = logging.getLogger(__name__)

FINGERPRINTED_FILES: tuple[str, ...] = ("effects.csv", "key_components.json", "prompts.jsonl")
"""What the analyses read of an identify run, and so what its fingerprint covers."""

_CREATED = "%Y-%m-%dT%H:%M:%S%z"


def identify_fingerprint(folder: str | os.PathLike[str]) -> str:
    """sha256 (16 hex digits) of the files of an identify run that analyses read; a missing file counts as empty."""
    digest = hashlib.sha256()
    for name in FINGERPRINTED_FILES:
        path = Path(folder) / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
    return digest.hexdigest()[:16]


def read_metadata(folder: Path, name: str = "metadata.json", stage: str = "its stage") -> dict[str, Any] | None:
    """A folder's metadata.json (or another JSON record `name` that `stage` writes) as a dict; None when it has
    none; ConfigError when it is not a JSON object."""
    path = folder / name
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{str(path)!r} cannot be read as JSON ({err.__class__.__name__}); rerun {stage}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{str(path)!r} is not a JSON object; rerun {stage}")
    return value


def scored_answer_digits(metadata: dict[str, Any]) -> bool:
    """Whether an identify run's metadata.json says it scored its answers token by token (--answer-digits)."""
    return bool((metadata.get("config") or {}).get("answer_digits"))


def refuse_answer_digits(folder: Path, what: str) -> None:
    """ConfigError if the identify run in `folder` scored its answers token by token (identify --answer-digits):
    `what` (an analysis that reads one answer token per prompt) would score the first token only."""
    if scored_answer_digits(read_metadata(folder) or {}):
        raise ConfigError(
            f"the identify run {str(folder)!r} scored its answers token by token (--answer-digits), and {what} "
            "reads one answer token per prompt; give it an identify run made without --answer-digits"
        )


def identify_record(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """What an analysis records of the identify run it read: path, fingerprint and when it was made."""
    path = Path(folder)
    return {
        "path": str(path.resolve()),
        "fingerprint": identify_fingerprint(path),
        "created": (read_metadata(path) or {}).get("created"),
    }


def recorded_runs(metadata: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The identify runs an analysis's metadata records having read (empty when none); None when the record
    does not say (made before fingerprints were recorded) or cannot be read."""
    if "identify_runs" in metadata:
        runs = metadata["identify_runs"]
    elif "identify_run" in metadata:  # the one-run key of the records of 2026-12-01
        runs = [metadata["identify_run"]]
    else:
        return None
    if not isinstance(runs, list):
        return None
    runs = [r for r in runs if r is not None]  # the records of 2026-12-01 wrote null for "read none"
    return runs if all(isinstance(r, dict) and r.get("fingerprint") for r in runs) else None


def _when(text: Any) -> datetime | None:
    try:
        return datetime.strptime(str(text), _CREATED)
    except ValueError:
        return None


def stale_reason(metadata: dict[str, Any], fingerprint: str, created: Any) -> str | None:
    """Why the analysis with `metadata` was not computed from the identify run (`fingerprint`, `created`); None
    when it was, or when its record says it read none."""
    runs = recorded_runs(metadata)
    if runs == []:
        return None
    if runs:
        if any(r["fingerprint"] == fingerprint for r in runs):
            return None
        recorded = ", ".join(str(r["fingerprint"]) for r in runs)
        return f"it was computed from another identify run (fingerprint {recorded}), not this one ({fingerprint})"
    made, identified = _when(metadata.get("created")), _when(created)
    if made is not None and identified is not None and made < identified:
        return f"it was made ({metadata.get('created')}) before this identify run ({created}), so from an earlier one"
    return None


def identify_folder(run_dir: str | os.PathLike[str], option: str = "--from") -> Path:
    """The finished identify run folder that `run_dir` names (see the module docstring); ConfigError otherwise."""
    path = Path(run_dir).expanduser()
    if not path.exists():
        raise ConfigError(f"run folder {str(path)!r} does not exist; give the --out folder of an identify run")
    if not path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is a file; give the identify run folder, e.g. {str(path.parent)!r}")
    metadata = read_metadata(path)
    if metadata is not None:
        if metadata.get("stage") == "identify":
            return path
        read = [r.get("path") for r in recorded_runs(metadata) or []] or [metadata.get("config", {}).get("from_run")]
        hint = f" ({', '.join(repr(p) for p in read)})" if any(read) else ""
        raise ConfigError(
            f"run folder {str(path)!r} is not an identify run (stage {metadata.get('stage')!r}); give {option} the "
            f"identify run folder{' it read' + hint if hint else ''}"
        )
    inside = path / "identify"
    if inside.is_dir():
        if (read_metadata(inside) or {}).get("stage") != "identify":
            raise ConfigError(
                f"run folder {str(path)!r} holds identify/, but it has no metadata.json, so its identify stage did "
                "not finish; rerun it (the same `arithmech run` resumes it)"
            )
        logger.info("%s is the folder of `arithmech run`: using its identify run %s", path, inside)
        return inside
    found = [d for d in sorted(path.iterdir()) if d.is_dir() and (read_metadata(d) or {}).get("stage") == "identify"]
    if len(found) == 1:
        logger.info("%s holds one identify run: using %s", path, found[0])
        return found[0]
    if found:
        names = ", ".join(repr(str(d)) for d in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise ConfigError(
            f"run folder {str(path)!r} holds {len(found)} identify runs ({names}); give one of them to {option}"
        )
    raise ConfigError(
        f"run folder {str(path)!r} has no metadata.json, so its identify run did not finish (or it is no identify "
        "run); rerun identify, or give the --out folder of a finished one"
    )


def move_aside_stale(out: Path, fingerprint: str, created: str) -> Path | None:
    """Move the analyses in `out`'s subfolders that do not belong to the identify run (`fingerprint`, `created`)
    being written into `out` to out/stale-<time>/, and say so in one warning; return that folder, if any."""
    stale = []
    for folder in sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith((".", "stale-"))):
        try:
            metadata = read_metadata(folder)
        except ConfigError:
            continue
        if metadata is not None and stale_reason(metadata, fingerprint, created):
            stale.append(folder)
    if not stale:
        return None
    stamp = time.strftime("stale-%Y%m%d-%H%M%S")
    aside, n = out / stamp, 1
    while aside.exists():  # two identify runs in one second: never merge into (or clash with) the earlier one
        aside, n = out / f"{stamp}-{n}", n + 1
    aside.mkdir()
    for folder in stale:
        folder.rename(aside / folder.name)
    logger.warning(
        "identify has a new result in %s: moved the analyses of the earlier run (%s) to %s; rerun them with --from %s",
        out, ", ".join(f.name for f in stale), aside, out,
    )  # fmt: skip
    return aside
