"""A full disk while a stage writes: one sentence naming the file and exit 2, nothing half-written, the earlier
version of the file kept, and a rerun (with space again) that resumes and gives a never-failed run's results.

The disk "fills up" at the Nth fsync of `runs.atomic_open` (`run_folders.Faults`), N counted from a run that
never failed: for identify among its results, over the results of an earlier run with other settings; for
mediate between its two saved partial results (.partial/), so the rerun resumes from the first.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest

from arithmech.cli import disk_full_message, main

from run_folders import Faults, assert_same_results, check_intact

pytestmark = pytest.mark.usefixtures("one_thread")


def _disk_full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _named_file(stderr: str, kept_in: Path) -> Path:
    """The file named by the one-sentence message (checked, with the folder whose work is kept).

    The message is stderr's last line and its only error (a progress bar of transformers may come before it).
    """
    message = stderr.splitlines()[-1]
    assert stderr.count("error:") == 1 and message.startswith("error: disk full while writing "), stderr
    assert message.endswith(f": free some space (or choose --out on another disk) and rerun; finished work is kept "
                            f"in {kept_in}"), message  # fmt: skip
    found = re.search(r"while writing (.+?): free", message)
    assert found is not None
    return Path(found.group(1))


def test_identify_on_a_full_disk(tiny_model_dir, tmp_path: Path, capsys, monkeypatch) -> None:
    model = tiny_model_dir("llama")

    def identify(out: Path, seed: int) -> list[str]:
        return ["identify", "--model", str(model), "--keep-incorrect", "--formations", "equation", "--n-per-template",
                "2", "--batch-size", "2", "--seed", str(seed), "--out", str(out), "--quiet"]  # fmt: skip

    faults = Faults(monkeypatch)
    never_failed = tmp_path / "never-failed"
    with faults.armed():
        assert main(identify(never_failed, seed=1)) == 0
    writes = faults.counts["write"]  # saved chunks, then effects.csv ... template_accuracy.csv, figures, metadata
    out = tmp_path / "run"
    assert main(identify(out, seed=0)) == 0  # an earlier run with other settings, in the same folder
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()

    with faults.armed("write", writes - 3, error=_disk_full):  # among the results: some written, some not
        assert main(identify(out, seed=1)) == 2
    named = _named_file(capsys.readouterr().err, kept_in=out)
    assert named.parent == out and named.name in before
    assert named.read_bytes() == before[named.name]  # the file being written keeps its earlier version
    check_intact(out)
    assert not (out / "metadata.json").exists()  # the folder reads as unfinished
    assert (out / "effects.csv").read_bytes() != before["effects.csv"]  # written before the disk filled up

    assert main(identify(out, seed=1)) == 0
    assert_same_results(out, never_failed)


def test_mediate_on_a_full_disk_resumes_from_its_saved_part(tiny_model_dir, tmp_path: Path, capsys, monkeypatch):
    model = tiny_model_dir("llama")

    def mediate(out: Path) -> list[str]:
        return ["mediate", "--model", str(model), "--tasks", "addition", "--n-pairs", "2", "--few-shot", "1",
                "--neuron-k", "3", "--out", str(out), "--quiet"]  # fmt: skip

    faults = Faults(monkeypatch)
    never_failed = tmp_path / "never-failed"
    assert main(mediate(never_failed)) == 0
    out = tmp_path / "run"
    capsys.readouterr()
    with faults.armed("write", 2, error=_disk_full):  # the second partial result: the task's neuron effects
        assert main(mediate(out)) == 2
    named = _named_file(capsys.readouterr().err, kept_in=out)  # the stage folder, above .partial/
    assert named.parent == out / ".partial" and named.name.startswith("addition-neurons")
    files = check_intact(out)
    assert [p.name for p in files] == [p.name for p in (out / ".partial").glob("addition-mediation-*.pt")]

    assert main(mediate(out)) == 0
    assert json.loads((out / "metadata.json").read_text())["resumed"] == ["addition-mediation"]
    assert_same_results(out, never_failed)


@pytest.mark.parametrize(
    ("code", "path", "expected"),
    [
        (errno.ENOSPC, "runs/demo/identify/effects.csv",
         "disk full while writing runs/demo/identify/effects.csv: free some space (or choose --out on another "
         "disk) and rerun; finished work is kept in runs/demo/identify"),
        (errno.EDQUOT, "runs/demo/identify/.partial/1f2e/chunk-00003.pt",
         "disk quota exceeded while writing runs/demo/identify/.partial/1f2e/chunk-00003.pt: free some space (or "
         "choose --out on another disk) and rerun; finished work is kept in runs/demo/identify"),
        (errno.ENOSPC, "runs/ft/checkpoints/.staging-00000100/optimizer.pt",
         "finished work is kept in runs/ft/checkpoints"),
        (errno.ENOSPC, None, "disk full while writing results: free some space"),
    ],
)  # fmt: skip
def test_disk_full_message(code: int, path: str | None, expected: str) -> None:
    err = OSError(code, os.strerror(code)) if path is None else OSError(code, os.strerror(code), path)
    assert expected in disk_full_message(err)


def test_other_os_errors_are_not_disk_full(monkeypatch) -> None:
    """Only a full disk (or quota) becomes a one-sentence message; other OSErrors keep their traceback."""
    import arithmech.cli as cli

    def broken(*_a, **_k):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(OSError, match="Input/output error"):
        main(["identify"])
