"""Run folders: where a stage writes its results, atomically, with provenance beside them.

Every file is written to a temporary name in the same folder and renamed into place, so an interrupted run
never leaves a half-written file: a reader sees the old file, the new file, or none. When the disk fills up
meanwhile, the error names the file being written (not its temporary name), so the CLI can say which.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

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


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside `path`; on success rename it to `path`, on any error delete it.

    `path` keeps its previous content (or stays absent) unless the whole write succeeds. A full disk while
    writing is raised as OSError(ENOSPC or EDQUOT) whose filename is `path`.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    binary = "b" in mode
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
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


def csv_text(
    rows: Sequence[Mapping[str, Any]], fieldnames: Sequence[str] | None = None, float_format: str | None = None
) -> str:
    """`rows` as CSV text, header first: columns `fieldnames`, else the first row's keys; floats written with
    `float_format` (e.g. ".6f") when given, else as Python prints them.

    The csv writer quotes only the line terminator's characters, so a field holding a carriage return (a token
    such as "\\r") would split its row when read back; such a row is written with every field quoted."""
    columns = list(fieldnames) if fieldnames is not None else list(rows[0]) if rows else []
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    quoted = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writeheader()
    for row in rows:
        if float_format is not None:
            row = {k: format(v, float_format) if isinstance(v, float) else v for k, v in row.items()}
        (quoted if any("\r" in str(v) for v in row.values()) else writer).writerow(row)
    return buffer.getvalue()


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


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
