"""The `arithmech` command line.

Heavy imports (torch, transformers, matplotlib) happen only when a command runs: importing this package, --help,
--version and a bad option value need none of them (a test checks), so they answer in about 0.1 s.

Examples:
    arithmech --version
    arithmech identify                                   # built-in SmolLM2-135M, addition prompts
    arithmech identify --threads 4 --quiet               # 4 CPU threads; only the results on the screen
    arithmech identify --operations addition,multiplication --max-prompts 128 --out runs/add-mul
    arithmech identify --model Qwen/Qwen2.5-0.5B --device cuda --dtype bfloat16
    arithmech identify --model ./my-model-dir --gguf-file model.Q8_0.gguf
    arithmech identify --prompts my_prompts.jsonl --variant direct

Every expected failure ends with one sentence on stderr and exit status 2, a full disk included; Ctrl-C ends
with status 130 and SIGTERM (`kill`) with 143, each through the same clean-up (the output folder's lock is
released). None leaves a half-written file, and a rerun resumes or restarts the stage.
"""

from __future__ import annotations

import errno
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from arithmech import run_lock
from arithmech.cli import analyze, circuit, identify, improve, mechanisms, pipeline, plan, report, validate  # noqa: F401  (each registers its commands)
from arithmech.cli.app import app
from arithmech.errors import ArithmechError
from arithmech.runs import disk_full_error

__all__ = ["app", "main"]


class Terminated(BaseException):
    """SIGTERM, raised where the command is, so that it ends as Ctrl-C does: every `finally` runs, the output
    folder's lock is released and a folder made only for it removed (Python's default would end at once)."""


@contextmanager
def _sigterm_ends_in_order() -> Iterator[None]:
    """SIGTERM raises Terminated for the block (in the main thread; elsewhere signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status (testable without a subprocess)."""
    try:
        with _sigterm_ends_in_order():
            code = _run(argv)
    except ArithmechError as err:
        typer.echo(f"error: {err}", err=True)
        return 2
    except KeyboardInterrupt:
        typer.echo("interrupted; no half-written files were left", err=True)
        return 130
    except Terminated:
        typer.echo("terminated (SIGTERM); no half-written files were left", err=True)
        return 143
    except typer.Exit as done:
        return int(done.exit_code or 0)
    except Exception as err:  # a full disk, or a usage error of the (vendored) click inside typer
        full = disk_full_error(err)
        if full is not None:
            typer.echo(f"error: {disk_full_message(full)}", err=True)
            return 2
        if hasattr(err, "show") and isinstance(getattr(err, "exit_code", None), int):
            err.show()
            return err.exit_code
        raise
    if code == 130:
        typer.echo("interrupted; no half-written files were left", err=True)
    return code if isinstance(code, int) else 0


def _run(argv: list[str] | None) -> object:
    """The app's exit code when a command exits early (e.g. 130); the output folder it locked is released."""
    try:
        return app(args=argv, standalone_mode=False)
    finally:
        run_lock.release_all()


def disk_full_message(err: OSError) -> str:
    """One sentence for a full disk (or quota): the file being written and the folder whose finished work is kept."""
    what = "disk quota exceeded" if err.errno == getattr(errno, "EDQUOT", None) else "disk full"
    fix = "free some space (or choose --out on another disk) and rerun"
    if not err.filename:
        return f"{what} while writing results: {fix}; finished work is kept"
    path = Path(str(err.filename))
    return f"{what} while writing {path}: {fix}; finished work is kept in {_kept_folder(path)}"


def _kept_folder(path: Path) -> Path:
    """The folder a rerun resumes from: the file's, or the stage folder above .partial/ and staging folders."""
    partial = next((p for p in path.parents if p.name == ".partial"), None)
    folder = partial.parent if partial is not None else path.parent
    while folder.name.startswith(".") and folder != folder.parent:
        folder = folder.parent
    return folder


if __name__ == "__main__":
    sys.exit(main())
