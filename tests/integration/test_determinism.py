"""The same config and seed give byte-identical results, and metadata.json holds what a rerun needs.

For identify, knockout (random-rank draws, resampled ablation) and mediate, the second run is rebuilt from the
first run's metadata.json alone: the model is reloaded from its recorded source and the stage config from its
recorded config. Its CSVs must equal the first run's byte for byte. Another seed must change the prompts (and
knockout's random draws), so the comparison is not vacuous.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.stages.identify import identify
from arithmech.stages.identify_config import IdentifyConfig
from arithmech.stages.knockout import knockout
from arithmech.stages.knockout_config import KnockoutConfig
from arithmech.stages.mediate import mediate
from arithmech.stages.mediate_config import MediateConfig

pytestmark = pytest.mark.usefixtures("one_thread")

IDENTIFY = IdentifyConfig(formations=("equation",), n_per_template=4, max_prompts=8, filter_correct=False, batch_size=4)
MEDIATE = MediateConfig(tasks=("addition",), n_pairs=2, few_shot=1, neuron_k=3, components=("mlp",))


@pytest.fixture(scope="module")
def handle(tiny_model_dir) -> ModelHandle:
    return load_model(ModelConfig(model=str(tiny_model_dir("llama"))))


def metadata(run: Path) -> dict[str, Any]:
    return json.loads((run / "metadata.json").read_text())


def rerun_handle(meta: dict[str, Any]) -> ModelHandle:
    """The model as recorded in a run's metadata."""
    source = meta["model"]
    return load_model(
        ModelConfig(model=source["model"], dtype=source["dtype"], device=source["device"], revision=source["revision"])
    )


def check_provenance(meta: dict[str, Any], stage: str, seed: int) -> None:
    assert meta["stage"] == stage and meta["seed"] == seed == meta["config"]["seed"]
    assert {"python", "arithmech", "torch", "transformers", "accelerate", "numpy"} <= set(meta["versions"])
    assert "git_sha" in meta and meta["processes"] == 1
    assert {"model", "model_type", "dtype", "device", "revision"} <= set(meta["model"])


def same_files(a: Path, b: Path, names: tuple[str, ...]) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture(scope="module")
def identify_runs(handle: ModelHandle, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("identify")
    identify(handle, IDENTIFY, root / "first", quiet=True)
    meta = metadata(root / "first")
    identify(rerun_handle(meta), IdentifyConfig(**meta["config"]), root / "again", quiet=True)
    identify(handle, IdentifyConfig(**{**meta["config"], "seed": 1}), root / "seed1", quiet=True)
    return {name: root / name for name in ("first", "again", "seed1")}


def test_identify_is_deterministic(identify_runs: dict[str, Path]) -> None:
    first, again, seed1 = identify_runs["first"], identify_runs["again"], identify_runs["seed1"]
    check_provenance(metadata(first), "identify", 0)
    assert IdentifyConfig(**metadata(first)["config"]) == IDENTIFY
    same_files(first, again, ("effects.csv", "key_components.json", "prompts.jsonl", "template_accuracy.csv"))
    assert (first / "prompts.jsonl").read_text() != (seed1 / "prompts.jsonl").read_text()


def test_knockout_is_deterministic(handle: ModelHandle, identify_runs: dict[str, Path], tmp_path: Path) -> None:
    cfg = KnockoutConfig(from_run=str(identify_runs["first"]), ablation="resample", max_k=4, n_random=3)
    knockout(handle, cfg, tmp_path / "first", quiet=True)
    meta = metadata(tmp_path / "first")
    check_provenance(meta, "knockout", 0)
    assert KnockoutConfig(**meta["config"]) == cfg
    knockout(rerun_handle(meta), KnockoutConfig(**meta["config"]), tmp_path / "again", quiet=True)
    same_files(tmp_path / "first", tmp_path / "again", ("knockout.csv", "knockout_summary.csv"))
    knockout(handle, KnockoutConfig(**{**meta["config"], "seed": 1}), tmp_path / "seed1", quiet=True)

    def draws(run: Path) -> list[str]:
        return [r["components"] for r in csv.DictReader((run / "knockout.csv").open()) if r["ranking"] == "random"]

    assert draws(tmp_path / "first") != draws(tmp_path / "seed1")


def test_mediate_is_deterministic(handle: ModelHandle, tmp_path: Path) -> None:
    mediate(handle, MEDIATE, tmp_path / "first", quiet=True)
    meta = metadata(tmp_path / "first")
    check_provenance(meta, "mediate", 0)
    assert MediateConfig(**meta["config"]) == MEDIATE
    mediate(rerun_handle(meta), MediateConfig(**meta["config"]), tmp_path / "again", quiet=True)
    tables = ("mediation_by_class.csv", "mediation_total.csv", "neuron_top.csv", "neuron_overlap.csv", "pairs.jsonl")
    same_files(tmp_path / "first", tmp_path / "again", tables)
    mediate(handle, MediateConfig(**{**meta["config"], "seed": 1}), tmp_path / "seed1", quiet=True)
    assert (tmp_path / "first" / "pairs.jsonl").read_text() != (tmp_path / "seed1" / "pairs.jsonl").read_text()
