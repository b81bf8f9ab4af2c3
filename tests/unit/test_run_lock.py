"""Two runs into one --out (issue 22.4): the second is refused before its model loads, naming the process that
holds the folder; a lock left by a dead process blocks nothing; a refused command leaves no folder behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import arithmech
from arithmech import run_lock
from arithmech.cli import main

SRC = str(Path(arithmech.__file__).resolve().parents[1])
HOLDER = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from arithmech import run_lock\n"
    "run_lock.hold(Path(sys.argv[1]))\n"
    "print('held', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that holds the lock of tmp_path/run (as `arithmech identify --out` would)."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run"), "identify", "--out", "x"],
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})  # fmt: skip
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


def test_a_second_run_into_a_locked_folder_names_the_holder(tmp_path: Path, holder, capsys) -> None:
    assert main(["identify", "--max-prompts", "4", "--out", str(tmp_path / "run")]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "is being written by process" in said, said
    assert f"process {holder.pid} on host {socket.gethostname()}" in said and "started " in said, said
    assert "identify --out x" in said and "give --out another folder" in said, said
    assert list((tmp_path / "run").iterdir()) == [tmp_path / "run" / run_lock.LOCK_NAME]  # the holder's, untouched


def test_a_lock_left_by_a_dead_process_blocks_nothing(tmp_path: Path, holder) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = tmp_path / "run" / run_lock.LOCK_NAME
    assert json.loads(lock.read_text())["pid"] == holder.pid  # left behind
    try:
        run_lock.hold(tmp_path / "run")
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        run_lock.hold(tmp_path / "run")  # again in the same process: a no-op
    finally:
        run_lock.release_all()
    assert not lock.exists() and (tmp_path / "run").is_dir()  # the folder was there before: kept


def test_the_lock_is_exclusive_between_processes_and_released(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    run_lock.hold(out)
    try:
        done = subprocess.run([sys.executable, "-c", HOLDER, str(out)], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": SRC})  # fmt: skip
        assert done.returncode != 0 and f"process {os.getpid()}" in done.stderr, done.stderr
    finally:
        run_lock.release_all()
    assert not (tmp_path / "a").exists()  # made only for the lock, and left empty: removed
