"""Run folders: where a stage writes its results, atomically, with provenance beside them.

Every file is written to a temporary name in the same folder and renamed into place, so an interrupted run
never leaves a half-written file: a reader sees the old file, the new file, or none. When the disk fills up
meanwhile, the error names the file being written (not its temporary name), so the CLI can say which.

Permissions are those of a plain `open()`: a new file gets 0o666 and a staging folder 0o777, less the umask
(so with umask 0022 colleagues on a shared machine can read the results), and a file written again keeps
its mode. `tempfile` itself would leave them 0o600 / 0o700, readable by their owner only.

No NaN or infinity reaches a result file. A number that is undefined (a share of a zero effect, a mean over
no draws) is written as an empty CSV cell or a JSON null (`defined`, `cell`), and its writer documents when;
`csv_text` and `atomic_write_json` refuse a NaN left in by mistake, naming the column or key.
"""

from __future__ import annotations

import csv
import errno
import functools
import hashlib
import io
import json
import math
import numbers
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

STAGE_FOLDERS: tuple[str, ...] = (
    "identify", "knockout", "transfer", "attention", "mlp", "fourier", "mediation", "agreement", "neurons",
    "heuristics", "numbers", "circuit", "finetune", "evaluate",
)  # fmt: skip
"""The stages of `arithmech run` in run order: the subfolders of its run folder, which reports read without
importing the pipeline (`pipeline.STAGES` runs them in this order; a test checks that they agree)."""

DISK_FULL_ERRNOS = frozenset(code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if code is not None)
"""errno values of a full disk (ENOSPC) or an exhausted disk quota (EDQUOT)."""


def disk_full_error(err: BaseException) -> OSError | None:
    """The disk-full OSError behind `err`: itself, or one it was raised from or during (torch.save, for one,
    turns a failed write into a RuntimeError raised while handling it); None if the disk is not the cause."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (/proc/self/status); elsewhere it is
    set and restored at once (os.umask is the only portable way to read it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def staging_folder(target: str | os.PathLike[str]) -> Path:
    """A new empty folder beside `target` (to fill, then rename onto it), with the umask's permissions."""
    final = Path(target)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    os.chmod(staging, 0o777 & ~current_umask())
    return staging


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside `path`; on success rename it to `path`, on any error delete it.

    `path` keeps its previous content (or stays absent) unless the whole write succeeds. A full disk while
    writing is raised as OSError(ENOSPC or EDQUOT) whose filename is `path`.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        file_mode = stat.S_IMODE(target.stat().st_mode)  # a file written again keeps its mode
    except FileNotFoundError:
        file_mode = 0o666 & ~current_umask()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    binary = "b" in mode
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
            os.chmod(tmp_name, file_mode)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException as err:
        Path(tmp_name).unlink(missing_ok=True)
        full = disk_full_error(err)
        if full is not None and full.filename in (None, tmp_name):  # a write of this file, not of another one
            raise OSError(full.errno, full.strerror, str(target)) from err
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically."""
    with atomic_open(path) as handle:
        handle.write(text)


def defined(value: float | None) -> float | None:
    """`value` as a float, or None when it is None, NaN or infinite.

    None is how a result file holds a number that is undefined (an empty CSV cell, a JSON null); the writer
    that calls this documents when and why a value can be undefined. A NaN or infinity is never written.
    """
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def defined_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` with every float through `defined`: for a table whose every number may be undefined."""
    return {key: defined(value) if isinstance(value, float) else value for key, value in row.items()}


def cell(value: float | None, spec: str) -> str:
    """A CSV cell: `value` formatted with `spec`, or "" for None (undefined); NaN and infinity are refused."""
    if value is None:
        return ""
    if _nonfinite(value):
        raise ValueError(f"a CSV cell is {value}; {_UNDEFINED}")
    return format(value, spec)


def csv_text(
    rows: Sequence[Mapping[str, Any]], fieldnames: Sequence[str] | None = None, float_format: str | None = None
) -> str:
    """`rows` as CSV text, header first: columns `fieldnames`, else the first row's keys; floats written with
    `float_format` (e.g. ".6f") when given, else as Python prints them; None as an empty cell (undefined).
    A NaN or infinity is refused (ValueError): its writer must say what an undefined value is.

    The csv writer quotes only the line terminator's characters, so a field holding a carriage return (a token
    such as "\\r") would split its row when read back; such a row is written with every field quoted."""
    columns = list(fieldnames) if fieldnames is not None else list(rows[0]) if rows else []
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    quoted = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writeheader()
    for number, row in enumerate(rows, 1):
        bad = next((key for key, value in row.items() if _nonfinite(value)), None)
        if bad is not None:
            raise ValueError(f"column {bad!r} of CSV row {number} is {row[bad]}; {_UNDEFINED}")
        if float_format is not None:
            row = {k: format(v, float_format) if isinstance(v, float) else v for k, v in row.items()}
        (quoted if any("\r" in str(v) for v in row.values()) else writer).writerow(row)
    return buffer.getvalue()


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically. A NaN or infinity anywhere in it is refused
    (ValueError naming where): a bare NaN is not JSON, and an undefined value is written as null."""
    at = _nonfinite_at(obj)
    if at is not None:
        raise ValueError(f"{Path(path).name}: {at} is not a finite number; {_UNDEFINED}")
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")


_UNDEFINED = "write an undefined value as None (an empty CSV cell, a JSON null) and document why"


def _nonfinite(value: Any) -> bool:
    """A NaN or infinity (Python, numpy or any other real number type)."""
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value)


def _nonfinite_at(obj: Any, at: str = "") -> str | None:
    """The key path of the first NaN or infinity in `obj` ("top_k[0].effect"), or None."""
    if isinstance(obj, Mapping):
        items: Any = ((f"{at}.{key}" if at else str(key), value) for key, value in obj.items())
    elif isinstance(obj, list | tuple):
        items = ((f"{at}[{index}]", value) for index, value in enumerate(obj))
    else:
        return (at or "the value") if _nonfinite(obj) else None
    for key, value in items:
        found = _nonfinite_at(value, key)
        if found is not None:
            return found
    return None


def package_versions() -> dict[str, str]:
    """Versions of Python and the packages whose behaviour a result depends on."""
    import importlib.metadata
    import platform

    versions = {"python": platform.python_version()}
    for name in ("arithmech", "torch", "transformers", "accelerate", "numpy", "gguf"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


@functools.cache
def code_version() -> str:
    """arithmech's version and a hash of its source files, as "0.1.0+<12 hex digits>": the code that computed a
    result. The keys of saved partial results (identify's chunks, mediate's tasks, neurons' steps) include it, so a
    rerun under changed code never mixes chunks the old code computed into its numbers; an installed wheel and a
    git checkout with uncommitted edits are told apart alike, which neither the version nor the git sha does."""
    from arithmech import __version__

    root = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}+{digest.hexdigest()[:12]}"


def git_sha() -> str | None:
    """The commit of the arithmech source tree, when it is a git checkout (None for an installed wheel)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
