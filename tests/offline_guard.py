"""Hide a folder and the network from the code under test, with an audit hook (PEP 578).

Inside `hidden(folder)`, opening any path inside `folder` (through `open`, `os.open`, `Path.read_*`, gzip...)
raises PermissionError, and a DNS lookup or a connection to an internet address raises ConnectionRefusedError.
Every refused attempt is also appended to `BLOCKED`, so a test sees an attempt even where the code under test
catches the error and carries on. The hook stays installed for the life of the process (audit hooks cannot be
removed) but does nothing outside a `hidden` block.

Usage
    >>> with hidden(Path("/work/shared")):
    ...     load_everything()
    >>> assert not BLOCKED

    python tests/offline_guard.py FOLDER run --config ...   # the arithmech CLI with FOLDER and the network
                                                            # hidden; exit status 3 if anything was refused
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BLOCKED: list[str] = []
_HIDDEN: list[str] = []
_installed = False


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _HIDDEN:
        return
    if event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
        path = os.path.realpath(os.fsdecode(args[0]))
        if any(path == root or path.startswith(root + os.sep) for root in _HIDDEN):
            BLOCKED.append(path)
            raise PermissionError(f"{path} is hidden by the test (offline_guard)")
    elif event == "socket.getaddrinfo" or (event == "socket.connect" and isinstance(args[1], tuple)):
        BLOCKED.append(f"{event} {args[1] if event == 'socket.connect' else args[0]}")
        raise ConnectionRefusedError("the network is off in this test (offline_guard)")


@contextmanager
def hidden(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Refuse every open() under `folder` and every internet connection inside the block."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
    _HIDDEN.append(os.path.realpath(Path(folder)))
    try:
        yield
    finally:
        _HIDDEN.pop()


def main(argv: list[str]) -> int:
    """`arithmech ARGS` with `argv[0]` hidden (imported inside the block, so imports are watched too)."""
    with hidden(argv[0]):
        from arithmech.cli import main as cli

        code = cli(argv[1:])
    if BLOCKED:
        sys.stderr.write("offline_guard refused: " + ", ".join(BLOCKED[:10]) + "\n")
        return code or 3
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
