"""No lock debris (issue 34.7): SIGTERM ends a command through the same clean-up as Ctrl-C, a Python API call that
fails releases its folder, and a stale lock left by a process that is gone is taken over with a note."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import arithmech as am
from arithmech import run_lock

from tiny_models import single_thread

SRC = str(Path(am.__file__).resolve().parents[1])


def test_sigterm_releases_the_lock_and_the_folder_made_for_it(tiny_model_dir, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "killed"
    model = str(tiny_model_dir("llama"))
    command = [sys.executable, "-m", "arithmech.cli", "circuit", "--model", model, "--keep-incorrect",
               "--n-prompts", "4", "--batch-size", "2", "--evaluate", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while not (out / run_lock.LOCK_NAME).exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.005)
    assert (out / run_lock.LOCK_NAME).exists(), "the command never locked its folder"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err[-2000:]
    assert "terminated (SIGTERM)" in err, err[-2000:]
    assert not (tmp_path / "runs").exists()  # made only for the lock, and left empty: removed


def test_a_failed_api_call_leaves_no_lock(tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import arithmech.stages.circuit as stage

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug inside the stage")

    monkeypatch.setattr(stage, "circuit", broken)
    with single_thread():
        model = am.load_model(str(tiny_model_dir("llama")), quiet=True)
        with pytest.raises(RuntimeError, match="a bug inside the stage"):
            am.circuit(model, out=tmp_path / "new" / "circuit", keep_incorrect=True, n_prompts=4, quiet=True)
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with single_thread(), pytest.raises(RuntimeError):
        am.circuit(model, out=kept, keep_incorrect=True, n_prompts=4, quiet=True)
    assert list(kept.iterdir()) == []  # the folder was there before: kept, without the lock file


def test_a_stale_lock_is_taken_over_with_a_note(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "run"
    out.mkdir()
    record = {"pid": 999999, "host": "gone", "command": "arithmech identify --out run", "started": "2026-01-01"}
    (out / run_lock.LOCK_NAME).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="arithmech"), run_lock.held(out):
        assert json.loads((out / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    said = caplog.text
    assert "took over the lock left by process 999999 on host gone" in said and "which has ended" in said, said
    assert not (out / run_lock.LOCK_NAME).exists()


def test_a_signal_while_the_lock_is_taken_is_handled_once_it_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arithmech.cli import Terminated, _sigterm_ends_in_order

    truncate = os.ftruncate

    def signalled_then_truncate(fd: int, length: int) -> None:  # SIGTERM after the lock file exists, before _HELD
        signal.raise_signal(signal.SIGTERM)
        truncate(fd, length)

    monkeypatch.setattr(run_lock.os, "ftruncate", signalled_then_truncate)
    with _sigterm_ends_in_order(), pytest.raises(Terminated):
        try:
            run_lock.hold(tmp_path / "runs" / "x")
        finally:
            run_lock.release_all()
    assert not (tmp_path / "runs").exists()
