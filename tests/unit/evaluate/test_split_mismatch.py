"""evaluate of a model fine-tuned on one arithmetic split, on another split's test prompts, is refused before a
model loads unless asked for (issue 22.3): a test prompt of split seed 1 may be a train prompt of seed 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arithmech.cli import main
from arithmech.data.arithmetic_split import make_split
from arithmech.errors import ConfigError
from arithmech.pipeline import load_run_config, run_pipeline
from arithmech.stages.evaluate_config import EvaluateConfig


def _delta(folder: Path, split_seed: int | None) -> Path:
    """A finetune output folder as evaluate --delta reads it before the model loads."""
    folder.mkdir(parents=True)
    (folder / "delta.json").write_text("{}")
    (folder / "delta.safetensors").write_bytes(b"")
    if split_seed is not None:
        (folder / "split.json").write_text(json.dumps(make_split(split_seed).record()))
    return folder


def test_cli_refuses_another_split_before_the_model_loads(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    delta = _delta(tmp_path / "ft", split_seed=0)
    argv = ["evaluate", "--delta", str(delta), "--benchmarks", "arithmetic-subtraction", "--split-seed", "1",
            "--out", str(tmp_path / "e")]  # fmt: skip
    assert main(argv) == 2
    said = capsys.readouterr().err
    assert "split of seed 0" in said and "seed 1" in said and "--split-seed 0" in said, said
    assert "--allow-split-mismatch" in said and said.count("\n") == 1
    assert not (tmp_path / "e").exists()


def test_same_split_other_data_or_allowed_pass() -> None:
    trained = make_split(0).record()
    EvaluateConfig(benchmarks=("arithmetic-subtraction",), split_seed=0).refuse_other_split(trained, "d")
    EvaluateConfig(benchmarks=("arithmetic-multidigit",), split_seed=1, allow_split_mismatch=True).refuse_other_split(
        trained, "d"
    )
    EvaluateConfig(benchmarks=("gsm8k",), split_seed=1).refuse_other_split(trained, "d")  # asks no split
    with pytest.raises(ConfigError, match="arithmetic-multidigit"):
        EvaluateConfig(benchmarks=("gsm8k", "arithmetic-multidigit"), split_seed=1).refuse_other_split(trained, "d")


def test_arithmech_run_refuses_evaluate_on_another_split_than_finetune(tmp_path: Path) -> None:
    cfg = load_run_config(None, {"out": str(tmp_path / "r"), "stages": ["identify", "finetune", "evaluate"],
                                 "finetune.data": "arithmetic", "evaluate.benchmarks": "arithmetic",
                                 "evaluate.split_seed": 1})  # fmt: skip
    with pytest.raises(ConfigError, match="evaluate.split_seed: 0, or give evaluate.allow_split_mismatch: true"):
        run_pipeline(cfg)
    assert not (tmp_path / "r").exists()
    _delta(tmp_path / "r2" / "finetune", split_seed=0)
    (tmp_path / "r2" / "finetune" / "metadata.json").write_text(json.dumps({"stage": "finetune"}))
    cfg = load_run_config(None, {"out": str(tmp_path / "r2"), "stages": ["evaluate"],
                                 "evaluate.benchmarks": "arithmetic", "evaluate.split_seed": 1})  # fmt: skip
    with pytest.raises(ConfigError, match="was fine-tuned on the arithmetic split of seed 0"):
        run_pipeline(cfg)
