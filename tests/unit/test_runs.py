"""atomic_open: a failed write leaves the target as it was, no temporary file, and a full disk names the target;
no NaN or infinity reaches a CSV or JSON file."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from arithmech.runs import atomic_open, atomic_write_json, cell, csv_text, defined, defined_row, disk_full_error

DISK_FULL = [errno.ENOSPC, errno.EDQUOT]


def _full(code: int = errno.ENOSPC) -> OSError:
    return OSError(code, os.strerror(code))


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("code", DISK_FULL)
def test_previous_content_survives_a_full_disk(tmp_path: Path, code: int) -> None:
    target = tmp_path / "effects.csv"
    target.write_text("old\n")
    with pytest.raises(OSError) as info, atomic_open(target) as handle:
        handle.write("new, half of it")
        raise _full(code)
    assert target.read_text() == "old\n"
    assert _left(tmp_path) == ["effects.csv"]
    assert info.value.errno == code and info.value.filename == str(target)  # the target, not the temporary name


def test_a_failed_fsync_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(_fd: int) -> None:
        raise _full()

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic_write_json(tmp_path / "metadata.json", {"stage": "identify"})
    assert _left(tmp_path) == []
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "metadata.json")


class _FullDisk(io.BytesIO):
    """A file whose third write finds the disk full."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.writes += 1
        if self.writes > 2:
            raise _full()
        return super().write(data)


def test_torch_save_on_a_full_disk_is_a_disk_full_error(tmp_path: Path) -> None:
    """torch.save turns the failed write into a RuntimeError raised while handling it; the OSError is behind it."""
    target = tmp_path / "chunk-00001.pt"
    torch.save({"old": torch.zeros(2)}, target)
    with pytest.raises(OSError) as info, atomic_open(target, "wb"):
        torch.save({"per_prompt": torch.randn(64, 8)}, _FullDisk())
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert torch.equal(torch.load(target)["old"], torch.zeros(2)) and _left(tmp_path) == [target.name]


def test_ctrl_c_and_other_errors_pass_through_unchanged(tmp_path: Path) -> None:
    target = tmp_path / "key_components.json"
    target.write_text("{}")
    with pytest.raises(KeyboardInterrupt), atomic_open(target) as handle:
        handle.write('{"key"')
        raise KeyboardInterrupt
    denied = PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(PermissionError) as info, atomic_open(target) as handle:
        raise denied
    assert info.value is denied and info.value.filename is None
    elsewhere = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "other.csv"))
    with pytest.raises(OSError) as info, atomic_open(target):
        raise elsewhere
    assert info.value is elsewhere  # a full disk while writing another file keeps that file's name
    assert target.read_text() == "{}" and _left(tmp_path) == [target.name]


def test_disk_full_error_finds_the_cause() -> None:
    full = _full()
    try:
        try:
            raise full
        except OSError as err:
            raise RuntimeError("file write failed") from err
    except RuntimeError as wrapped:
        assert disk_full_error(wrapped) is full
    assert disk_full_error(OSError(errno.EIO, "I/O error")) is None
    assert disk_full_error(ValueError("x")) is None


def test_csv_text_orders_columns_and_formats_floats() -> None:
    rows = [{"k": 1, "acc": 0.5, "name": "a"}, {"k": 2, "acc": 1 / 3, "name": "b"}]
    assert csv_text(rows) == f"k,acc,name\n1,0.5,a\n2,{1 / 3},b\n"
    assert csv_text(rows, ("name", "acc", "k"), ".3f") == "name,acc,k\na,0.500,1\nb,0.333,2\n"
    assert csv_text([], ("a", "b")) == "a,b\n"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), np.float32("nan")])
def test_no_nan_or_infinity_is_written(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match=r"key_components\.json: top_k\[1\]\.fraction_of_total is not a finite"):
        atomic_write_json(tmp_path / "key_components.json", {"top_k": [{"effect": 0.1}, {"fraction_of_total": bad}]})
    with pytest.raises(ValueError, match="column 'accuracy' of CSV row 2"):
        csv_text([{"k": 1, "accuracy": 0.5}, {"k": 2, "accuracy": bad}])
    with pytest.raises(ValueError, match="a CSV cell is"):
        cell(bad, ".6f")
    assert _left(tmp_path) == []


def test_undefined_numbers_are_null_or_empty(tmp_path: Path) -> None:
    row = defined_row({"k": 1, "mean": float("nan"), "std": float("inf"), "n": 0, "name": "x", "p": 0.25})
    assert row == {"k": 1, "mean": None, "std": None, "n": 0, "name": "x", "p": 0.25}
    assert csv_text([row], float_format=".3f") == "k,mean,std,n,name,p\n1,,,0,x,0.250\n"
    assert defined(np.float64(2.5)) == 2.5 and defined(None) is None and cell(None, ".6f") == ""
    atomic_write_json(tmp_path / "m.json", {"share": defined(float("nan")), "n": 3})
    assert json.loads((tmp_path / "m.json").read_text()) == {"share": None, "n": 3}


def test_csv_text_rows_with_a_carriage_return_read_back_whole() -> None:
    """A decoded token can be "\\r"; the csv writer does not quote it (only the "\\n" terminator), so unquoted it
    split the row in two when read back (the report then failed on a missing column)."""
    import csv

    rows = [{"neuron": "1_4", "tokens": "a | \r | b", "li": 0.5}, {"neuron": "1_5", "tokens": "c", "li": 1.5}]
    text = csv_text(rows)
    read = list(csv.DictReader(io.StringIO(text, newline="")))
    assert read == [{k: str(v) for k, v in row.items()} for row in rows]
    assert text.split("\n")[2] == "1_5,c,1.5"  # rows without one are written as before
