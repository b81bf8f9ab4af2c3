"""The README's new-user path, run as a newcomer runs it (issue 34): its first command reports key components on
the built-in default model (and its key_components.json holds them), and its Python quickstart runs top to bottom.
(The guides' commands are parsed, and their folders checked in order, by tests/integration/test_docs.py.)"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from arithmech.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.default_model


def first_command() -> list[str]:
    """The arguments of the `arithmech` line in the README's install block."""
    install = re.search(r"^## Install\n+```bash\n(.*?)^```", README.read_text(), re.S | re.M)
    assert install is not None, "README.md has no install block"
    lines = [line for line in install.group(1).splitlines() if line.startswith("arithmech ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].split("#")[0])[1:]


def test_the_readmes_first_command_reports_key_components(tmp_path: Path, monkeypatch, capsys) -> None:
    pytest.importorskip("gguf")
    monkeypatch.chdir(tmp_path)  # the command writes runs/first relative to where it runs
    args = first_command()
    assert args[0] == "identify"
    assert main([*args, "--quiet"]) == 0
    said = capsys.readouterr().out
    line = next(text for text in said.splitlines() if text.startswith("key components"))
    assert "none" not in line, line
    out = Path(args[args.index("--out") + 1])
    key = json.loads((tmp_path / out / "key_components.json").read_text())
    assert key["key"] and key["why_none"] is None
    assert [r["component"] for r in key["key"]] == line.split("): ", 1)[1].split(", ")


def test_the_readmes_python_quickstart_runs(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("gguf")
    [block] = re.findall(r"^## Python quickstart\n+```python\n(.*?)^```", README.read_text(), re.S | re.M)
    monkeypatch.chdir(tmp_path)  # it writes runs/quick relative to where it runs
    namespace: dict[str, object] = {"__name__": "__readme__"}
    exec(compile(block, "README.md quickstart", "exec"), namespace)  # noqa: S102
    for stage in ("identify", "knockout"):
        assert (tmp_path / "runs" / "quick" / stage / "metadata.json").is_file(), stage
    assert (tmp_path / "runs" / "quick" / "report.html").is_file()
    assert not list((tmp_path / "runs").rglob(".arithmech.lock"))  # every call released its folder
