"""Every stage declares, on its config class, the "stage" its runs record and whether it reads an identify run
(the pipeline runs identify before it then), and every stage's metadata.json lists the identify runs it read,
so an analysis of an earlier identify run is moved aside and reported stale whatever its stage (issue 22.1:
analyze fourier was left out of a hand-kept list, and its results were shown as current). The records themselves
are checked on every tiny architecture in tests/integration/test_arch_matrix.py."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any

import typer

import arithmech.stages
from arithmech.cli import app
from arithmech.pipeline import STAGES, canonical_stage
from arithmech.runs import STAGE_FOLDERS

READS_IDENTIFY = {
    "knockout": {"from_run": "/runs/x"}, "transfer": {}, "analyze_attention": {}, "analyze-mlp": {},
    "analyze-fourier": {}, "agreement": {}, "finetune": {"method": "precise", "from_run": "/runs/x"},
    "circuit": {"identify_run": "/runs/x"}, "analyze-numbers": {"identify_run": "/runs/x"},
}  # fmt: skip
"""The stages known to read an identify run, with settings under which they do."""
READS_NONE = {"identify", "mediate", "neurons", "heuristics", "evaluate"}
"""The stages known to read none."""
NOT_STAGES = {"run", "report", "plan"}
"""Commands that run no single stage of their own (plan plans stages, running none)."""


def test_run_folders_list_the_pipeline_stages_in_order() -> None:
    """Reports find a run's stage folders from `runs.STAGE_FOLDERS` (they do not import the pipeline)."""
    assert tuple(stage.name for stage in STAGES) == STAGE_FOLDERS


def _config_modules() -> list[str]:
    return [m.name for m in pkgutil.iter_modules(arithmech.stages.__path__) if m.name.endswith("_config")]


def stage_configs() -> dict[str, Any]:
    """metadata.json "stage" -> the config class of the stage that writes it, for every stages/*_config.py."""
    found: dict[str, Any] = {}
    for name in _config_modules():
        module = importlib.import_module(f"arithmech.stages.{name}")
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == module.__name__ and "STAGE" in vars(value):
                found[value.STAGE] = value
    return found


def test_every_config_module_declares_its_stage_once() -> None:
    for name in _config_modules():
        module = importlib.import_module(f"arithmech.stages.{name}")
        own = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__
               and "STAGE" in vars(v)]  # fmt: skip
        assert len(own) == 1, f"stages/{name}.py must define one config class with STAGE; found {own}"
        assert "reads_identify_run" in vars(own[0]), f"{own[0].__name__} must declare reads_identify_run itself"
    assert len(stage_configs()) == len(_config_modules())


def test_every_stage_is_known_to_read_an_identify_run_or_not() -> None:
    declared = stage_configs()
    assert set(declared) == set(READS_IDENTIFY) | READS_NONE, "classify the new stage in this test"
    for stage, config in READS_IDENTIFY.items():
        assert declared[stage].reads_identify_run(config), stage
    for stage in READS_NONE:
        assert not declared[stage].reads_identify_run({"from_run": "/runs/x", "sources": ["/runs/x"]}), stage


def test_every_pipeline_stage_and_command_has_a_declared_config() -> None:
    declared = set(stage_configs().values())
    for stage in STAGES:
        module, name = stage.config.split(":")
        assert getattr(importlib.import_module(module), name) in declared, stage.name
    by_name = {stage.name for stage in STAGES}

    def commands(group: Any, prefix: str) -> list[str]:  # typer's own (vendored) click
        found = []
        for name, command in group.commands.items():
            path = f"{prefix} {name}".strip()
            found += commands(command, path) if hasattr(command, "commands") else [path]
        return found

    names = commands(typer.main.get_command(app), "")
    assert {"identify", "analyze fourier", "finetune"} <= set(names)
    for name in names:
        known = name in NOT_STAGES or canonical_stage(name) in by_name
        assert known, f"command {name!r} runs no known stage"


def test_stage_modules_write_the_declared_stage_name() -> None:
    """A literal "stage" in a stage's metadata would drift from its config's STAGE, the one name of the stage."""
    folder = Path(arithmech.stages.__file__).parent
    for path in sorted(folder.glob("*.py")):
        literal = re.search(r'"stage": "[a-z_-]+"', path.read_text())
        assert literal is None, f"{path.name} writes {literal.group(0) if literal else ''}; write cfg.STAGE"


def test_a_fourier_analysis_of_an_earlier_identify_run_is_moved_aside(tmp_path: Path) -> None:
    import json

    from arithmech.lineage import move_aside_stale

    other: dict[str, Any] = {"path": "/runs/x", "fingerprint": "bbb", "created": "2026-01-01T10:00:00+0000"}
    (tmp_path / "fourier").mkdir()
    record = {"stage": "analyze-fourier", "identify_runs": [other]}
    (tmp_path / "fourier" / "metadata.json").write_text(json.dumps(record))
    aside = move_aside_stale(tmp_path, "aaa", "2026-01-02T10:00:00+0000")
    assert aside is not None and (aside / "fourier" / "metadata.json").is_file()
