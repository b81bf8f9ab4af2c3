"""One writer per run folder: an advisory lock on <out>/.arithmech.lock while a command writes there.

Why
    Two runs into one --out at once both report success, and the folder keeps a mix of their files or only
    those of the run that finished last. So the output folder is locked when a command has checked it (before
    its model loads), and a second command into it is refused with one sentence that names the holder: its
    pid, host, command line and start time, which the holder writes into the lock file.

Stale locks
    The lock is an flock(2) on the open lock file. The operating system releases it when its process ends,
    however it ends (an exception, Ctrl-C, kill -9, a crash), so a lock file left by a dead process blocks
    nothing: the next command takes the lock, says whose stale lock it took over, and writes itself in as the
    holder. Only kill -9 or a crash leaves such a file: the CLI turns SIGTERM into an orderly exit (`cli.main`),
    and the Python API releases its folder however the stage ends.

Lifetime
    `hold(out)` takes the lock, creating the folder when it is missing; it is held until `release(out)` or
    `release_all()` (the CLI calls it when a command ends, atexit otherwise), which remove the lock file and any
    folder that was created only for it and is still empty, so a command refused after its folder was locked
    leaves nothing. Ctrl-C and SIGTERM are held back while the lock is taken or released and handled just after,
    so a signal never falls between a lock file's creation and the record the clean-up reads. `held(out)` holds
    it for a block (`arithmech run`'s stages, called as a library too).
    Within one process a folder is locked once (taking it again is a no-op). In a launch of several processes
    only rank 0 takes it: the others write into the same folder as part of the same run.
    Where flock is missing (Windows) or not supported (some network file systems), a warning says the folder
    is not locked, and the command goes on.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from arithmech.distributed import launched_processes
from arithmech.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

LOCK_NAME = ".arithmech.lock"


@dataclass(frozen=True)
class _Held:
    fd: int
    path: Path
    created: Path | None
    """The topmost folder made for this lock (removed on release while empty), if any."""


_HELD: dict[Path, _Held] = {}


def hold(out: Path, option: str = "--out") -> None:
    """Lock `out` for this process (see the module docstring); ConfigError naming the holder when another
    process writes there."""
    key = out.expanduser().resolve()
    if key in _HELD or (launched_processes() > 1 and os.environ.get("RANK", "0") != "0"):
        return
    with _signals_deferred():
        _take(out, key, option)


def _take(out: Path, key: Path, option: str) -> None:
    """`hold`'s work, from making the folder to recording the lock: run with Ctrl-C and SIGTERM deferred."""
    missing = [p for p in (out, *out.parents) if not p.exists()]
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    created = missing[-1] if missing else None
    if fcntl is None:
        logger.warning("%s is not locked against a second run into it: this system has no flock", out)
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                _remove_created(out, created)
                raise ConfigError(f"{option} {str(out)!r} is being written by {holder(path)}; wait until it "
                                  f"ends, or give {option} another folder") from None  # fmt: skip
            logger.warning("%s is not locked against a second run into it: flock failed (%s)", out, err.strerror)
            return
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:  # not a file its last holder removed meanwhile
                break
        os.close(fd)
    stale = holder(path) if os.fstat(fd).st_size else None
    if stale is not None:
        logger.warning("%s: took over the lock left by %s, which has ended", out, stale)
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": started}
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(record).encode())
    if not _HELD:
        atexit.register(release_all)
    _HELD[key] = _Held(fd, path, created)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold back Ctrl-C and SIGTERM for the block and handle them after it, so that one arriving between the lock
    file's creation and its record in _HELD finds a clean-up that knows what to remove (main thread only: Python
    runs signal handlers there, so a mask would not defer them while other threads run)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {signum: signal.signal(signum, lambda number, frame: arrived.append(number))
                for signum in (signal.SIGINT, signal.SIGTERM)}  # fmt: skip
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        for signum in arrived[:1]:
            signal.raise_signal(signum)  # now handled by the restored handler


def holder(path: Path) -> str:
    """Who holds the lock file at `path`, as its holder wrote it: 'process 4242 on host h (`arithmech identify
    --out runs/x`, started 2026-12-01T19:20:01+00:00)'."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return (f"process {record['pid']} on host {record['host']} (`{record['command']}`, started "
                f"{record['started']})")  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it has not written its pid yet)"


@contextlib.contextmanager
def held(out: Path, option: str = "--out") -> Iterator[None]:
    """`hold(out)` for the block, released after it (however it ends) unless this process held it before."""
    before = out.expanduser().resolve() in _HELD
    hold(out, option)
    try:
        yield
    finally:
        if not before:
            release(out)


def release(out: Path) -> None:
    """Release `out` if this process locked it: remove its lock file, and the folders made only for it."""
    with _signals_deferred():
        held = _HELD.pop(out.expanduser().resolve(), None)
        if held is None:
            return
        with contextlib.suppress(OSError):
            held.path.unlink()
        os.close(held.fd)
        _remove_created(held.path.parent, held.created)


def release_all() -> None:
    """Release every folder this process locked."""
    for key in list(_HELD):
        release(key)


def _remove_created(out: Path, created: Path | None) -> None:
    """Remove `out` and its parents up to `created` (the topmost folder made for the lock) while they are empty."""
    if created is None:
        return
    for folder in (out, *out.parents):
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == created:
            return
