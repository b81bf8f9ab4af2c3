"""docs/tutorial.md runs: every Python block of the page, in order, in one namespace, on the built-in default
model at the page's own (tiny) size, so that the tutorial cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"

pytestmark = pytest.mark.default_model


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


def test_the_tutorial_runs_top_to_bottom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    blocks = python_blocks(TUTORIAL)
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)  # the page writes runs/tutorial/ relative to where it runs
    namespace: dict[str, object] = {"__name__": "__tutorial__"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{TUTORIAL.name} block {number}", "exec"), namespace)  # noqa: S102
    run = tmp_path / "runs" / "tutorial"
    for stage in ("identify", "knockout", "attention"):
        assert (run / stage / "metadata.json").is_file(), stage
    assert (run / "report.html").is_file() and namespace["page"] == Path("runs/tutorial/report.html")
    assert len(namespace["run"].identify.effects) == 30 * 9 + 30  # every head and MLP of SmolLM2-135M
