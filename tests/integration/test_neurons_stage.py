"""The neurons stage on a tiny model: every table and figure, numbers that match the engines, resume, bad input."""

from __future__ import annotations

import csv
import importlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from arithmech.cli import main
from arithmech.errors import ConfigError
from arithmech.models.load import ModelConfig, load_model
from arithmech.stages.neurons import neurons
from arithmech.stages.neurons_config import PRUNE_SCORES, NeuronsConfig

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {
    "operations": ("addition", "subtraction"), "max_prompts": 3, "filter_correct": False, "few_shot": 1,
    "top_heads": 2, "top_neurons": 4, "keep_sizes": (0, 8), "n_random": 2, "lora_steps": 2, "lora_rank": 2,
}  # fmt: skip


def test_stage_writes_everything(tiny_model_dir, tmp_path: Path) -> None:
    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama"))))
    out = tmp_path / "neurons"
    result = neurons(handle, NeuronsConfig(**SMALL), out, quiet=True)
    files = ("head_importance.csv", "specialisation.json", "head_importance.png", "attention_li.csv",
             "cna_neurons.csv", "pruning.csv", "pruning.png", "lora_coefficients.csv", "metadata.json")  # fmt: skip
    for name in files:
        assert (out / name).is_file(), name
    assert (out / "lora_adapter" / "adapter_config.json").is_file()
    assert not (out / ".partial").exists()
    dims = handle.dims
    importance = list(csv.DictReader((out / "head_importance.csv").open()))
    assert len(importance) == 2 * dims.n_layers * dims.n_heads
    row = importance[dims.n_heads + 1]  # addition, head 1.1
    assert float(row["prob_drop"]) == pytest.approx(float(result.importance.prob_drop[0, dims.n_heads + 1]), abs=1e-5)
    spec = json.loads((out / "specialisation.json").read_text())
    assert set(spec["top"]) == {"addition", "subtraction"} and all(len(v) == 2 for v in spec["top"].values())
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["head"] == spec["top"]["addition"][0]  # default key head: the most important on the first op
    assert meta["layers"] == list(range(dims.n_layers - 1, dims.n_layers))  # the last third of 3 layers
    pruning = list(csv.DictReader((out / "pruning.csv").open()))
    assert [(r["prompts"], int(r["keep"])) for r in pruning] == [("held-out", 0), ("held-out", 8), ("ranking", 0),
                                                                 ("ranking", 8)]  # fmt: skip
    assert meta["counts"]["pruning_prompts"] == {"held-out": 3, "ranking": 3}
    cna = list(csv.DictReader((out / "cna_neurons.csv").open()))
    assert len(cna) == 4 and float(cna[0]["cna"]) >= float(cna[-1]["cna"])
    assert float(cna[0]["cna"]) == pytest.approx(float(cna[0]["li_intact"]) - float(cna[0]["li_zeroed"]), abs=1e-4)


def test_a_finished_step_is_not_recomputed(tiny_model_dir, tmp_path: Path, monkeypatch) -> None:
    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama"))))
    out = tmp_path / "n"
    cfg = NeuronsConfig(**{**SMALL, "lora": False})

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    engines = importlib.import_module("arithmech.neurons")  # `arithmech.neurons` is the stage function (am.neurons)

    monkeypatch.setattr(engines, "pruning_sweep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        neurons(handle, cfg, out, quiet=True)
    assert len(list((out / ".partial").glob("*-importance.pt"))) == 1
    monkeypatch.undo()

    def no_rescan(*_a, **_k):
        raise AssertionError("head importance was recomputed")

    monkeypatch.setattr(engines, "head_importance", no_rescan)
    neurons(handle, cfg, out, quiet=True)
    assert (out / "metadata.json").is_file() and not (out / "lora_coefficients.csv").exists()


def test_bad_settings(tiny_model_dir, tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError, match="prune_by"):
        NeuronsConfig(prune_by="magic")
    with pytest.raises(ConfigError, match="operations"):
        NeuronsConfig(operations=("modulo",))
    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama"))))
    with pytest.raises(ConfigError, match="does not exist"):
        neurons(handle, NeuronsConfig(**{**SMALL, "layers": (7,)}), tmp_path / "x", quiet=True)
    model = str(tiny_model_dir("llama"))
    assert main(["neurons", "--model", model, "--head", "mlp.1", "--no-filter-correct", "--quiet"]) == 2
    assert "not 'mlp.1'" in capsys.readouterr().err
    assert PRUNE_SCORES == ("cna", "li")


def test_pruning_is_scored_on_prompts_that_did_not_rank_the_neurons(tiny_model_dir) -> None:
    """The held-out set holds answered prompts of the same operation, none of them in the ranking set."""
    from arithmech.data.reference_config import ReferenceSetConfig
    from arithmech.data.reference_set import build_reference_set
    from arithmech.neurons import heldout_set, operation_sets

    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama"))))
    cfg = ReferenceSetConfig(max_prompts=5, filter_correct=False, few_shot=1, n_per_template=2)
    sets, _ = operation_sets(handle, cfg, ("addition",))
    held = heldout_set(handle, cfg, "addition", 5)
    assert held is not None and len(held) == 5
    ranked_on = sets["addition"]
    ranking = {tuple(row[: int(n)].tolist()) for row, n in zip(ranked_on.ref_ids, ranked_on.end + 1, strict=True)}
    for row, n in zip(held.ref_ids, held.end + 1, strict=True):
        assert tuple(row[: int(n)].tolist()) not in ranking
    kept = len(build_reference_set(handle, replace(cfg, operations=("addition",), max_prompts=100)).tokenized.pairs)
    every = heldout_set(handle, cfg, "addition", 100)
    assert every is not None and len(every) == kept - 5  # all the other answered prompts
    assert heldout_set(handle, replace(cfg, max_prompts=kept), "addition", 5) is None
