"""examples/walkthrough.py runs top to bottom (on a tiny model with small settings)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest


def test_walkthrough_runs(tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("ARITHMECH_EXAMPLE_MODEL", str(tiny_model_dir("llama")))
    monkeypatch.setenv("ARITHMECH_EXAMPLE_SMALL", "1")
    monkeypatch.setenv("ARITHMECH_EXAMPLE_OUT", str(tmp_path / "walk"))
    runpy.run_path(str(Path(__file__).parents[2] / "examples" / "walkthrough.py"), run_name="__main__")
    stdout = capsys.readouterr().out
    assert "whole-prompt effect" in stdout and "Spearman" in stdout and "key head" in stdout
    for stage in ("identify", "knockout", "attention", "mediation", "agreement", "neurons"):
        assert (tmp_path / "walk" / stage / "metadata.json").is_file(), stage
