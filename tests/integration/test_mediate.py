"""mediate end to end on tiny models: the run folder's tables equal a direct call of the mediation engine,
neuron overlaps are |A ∩ B| / k of the written top-k lists, a finished task is reused after an interruption,
and bad settings are one ConfigError.

The tiny byte-level tokenizer gives one token per character, so arithmetic and retrieval pairs (digits swap
for digits) always keep their length, while facts whose subjects differ in length are rejected and counted.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from arithmech.data.mediation_prompts import FORMATS
from arithmech.data.mediation_tokens import POSITION_CLASSES
from arithmech.errors import ConfigError
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.patching.mediation import mediation_effects, neuron_effects
from arithmech.stages import mediate as mediate_module
from arithmech.stages.mediate import (
    MediateResult,
    mediate,
    mediation_items,
    read_mediation_run,
    resume_key,
)
from arithmech.stages.mediate_config import MediateConfig

pytestmark = pytest.mark.usefixtures("one_thread")

FILES = (
    "mediation_by_class.csv",
    "mediation_total.csv",
    "neuron_top.csv",
    "neuron_overlap.csv",
    "mediation_mean.png",
    "mediation_median.png",
    "pairs.jsonl",
    "metadata.json",
)
CFG = MediateConfig(n_pairs=3, few_shot=1, neuron_k=5)  # addition, retrieval, factual; all layers, mlp + attn
TOL = {"rtol": 1e-6, "atol": 1e-7}


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def llama(tiny_model_dir) -> ModelHandle:
    return load_model(ModelConfig(model=str(tiny_model_dir("llama"))))


@pytest.fixture(scope="module")
def llama_run(llama: ModelHandle, tmp_path_factory: pytest.TempPathFactory) -> MediateResult:
    return mediate(llama, CFG, tmp_path_factory.mktemp("mediate") / "run", quiet=True)


def check_against_engine(handle: ModelHandle, cfg: MediateConfig, result: MediateResult) -> None:
    """Every table of the run folder against direct engine calls on the same pairs."""
    out = result.out_dir
    by_class, totals = rows(out / "mediation_by_class.csv"), {r["task"]: r for r in rows(out / "mediation_total.csv")}
    layers = tuple(range(handle.dims.n_layers)) if cfg.layers is None else cfg.layers
    assert len(by_class) == len(cfg.tasks) * len(cfg.components) * len(layers) * len(POSITION_CLASSES)
    used = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    top = rows(out / "neuron_top.csv")
    for task in cfg.tasks:
        items, counts = mediation_items(handle.tokenizer, cfg, task)
        assert [item.pair for item in result.items[task]] == [item.pair for item in items]
        assert [json.loads(json.dumps(item.pair.to_dict())) for item in items] == [p for p in used if p["task"] == task]
        ticks: list[int] = []  # the progress callback: one tick per pair
        direct = mediation_effects(handle.view, items, layers, cfg.components, progress=ticks.append)
        assert ticks == [1] * len(items)
        torch.testing.assert_close(result.results[task].ie, direct.ie, equal_nan=True, rtol=0, atol=0)
        mean, median = direct.by_class("mean"), direct.by_class("median")
        for r in (r for r in by_class if r["task"] == task):
            component, layer, name = r["component"], int(r["layer"]), r["class"]
            cell = (cfg.components.index(component), layers.index(layer), POSITION_CLASSES.index(name))
            for column, table in (("mean_ie", mean), ("median_ie", median)):
                written = float(r[column]) if r[column] else float("nan")  # an empty cell is undefined
                torch.testing.assert_close(torch.tensor(written), table[cell], equal_nan=True, **TOL)
            absent = task == "factual" and name in ("middle", "operand2")  # facts have one operand (the subject)
            assert int(r["n_pairs"]) == (0 if absent else len(items))
        row = totals[task]
        assert int(row["pairs"]) == len(items) == counts["pairs"] == cfg.n_pairs
        assert int(row["considered"]) == len(items) + int(row["rejected_length_mismatch"]) + int(
            row["rejected_same_result_token"]
        )
        assert float(row["mean_te"]) == pytest.approx(float(direct.total_effect.mean()), rel=1e-6)
        accuracy = row["number_accuracy"]  # facts have no numbers: an empty cell
        assert accuracy == "" if task == "factual" else float(accuracy) == pytest.approx(direct.number_accuracy())
        if cfg.neuron_k:
            ie = neuron_effects(handle.view, items, result.neuron_layer, progress=ticks.append)  # [pair, neuron]
            assert ticks == [1] * 2 * len(items)
            expected = ie.mean(0).topk(cfg.neuron_k).indices.tolist()
            assert [int(r["neuron"]) for r in top if r["task"] == task] == expected
    assert count_hooks(handle.model) == 0


def check_overlaps(cfg: MediateConfig, out: Path) -> None:
    """neuron_overlap.csv: every ordered task pair, symmetric, in [0, 1], = |A ∩ B| / k of neuron_top.csv."""
    tops: dict[str, set[int]] = {}
    for r in rows(out / "neuron_top.csv"):
        tops.setdefault(r["task"], set()).add(int(r["neuron"]))
    overlap = {(r["task_a"], r["task_b"]): float(r["overlap"]) for r in rows(out / "neuron_overlap.csv")}
    assert set(overlap) == {(a, b) for a in cfg.tasks for b in cfg.tasks}
    for (a, b), value in overlap.items():
        assert 0.0 <= value <= 1.0 and value == overlap[(b, a)]
        assert value == pytest.approx(len(tops[a] & tops[b]) / cfg.neuron_k)
    assert all(overlap[(t, t)] == 1.0 for t in cfg.tasks)


def test_writes_every_file_and_the_reader_reads_them(llama: ModelHandle, llama_run: MediateResult) -> None:
    out = llama_run.out_dir
    assert all((out / name).is_file() for name in FILES)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no .partial, no temporary files
    assert all((out / name).read_bytes()[:4] == b"\x89PNG" for name in FILES if name.endswith(".png"))
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["stage"] == "mediate" and metadata["config"]["tasks"] == list(CFG.tasks)
    assert metadata["neuron_layer"] == llama_run.neuron_layer and metadata["resumed"] == []
    assert {"total_s", "addition-mediation_s"} <= set(metadata["timings"])
    run = read_mediation_run(out)
    assert run.tasks == CFG.tasks and run.layers == tuple(range(llama.dims.n_layers))
    for task, result in llama_run.results.items():
        torch.testing.assert_close(torch.from_numpy(run.table(task, "median")).float(), result.by_class("median"),
                                   equal_nan=True, **TOL)  # fmt: skip
        assert run.n_pairs[task][POSITION_CLASSES.index("last")] == CFG.n_pairs
    assert run.overlaps == {k: pytest.approx(v) for k, v in llama_run.overlaps.items()}


def test_tables_equal_direct_engine_calls(llama: ModelHandle, llama_run: MediateResult) -> None:
    check_against_engine(llama, CFG, llama_run)
    check_overlaps(CFG, llama_run.out_dir)
    first = llama_run.results["addition"]  # neuron layer: largest last-token MLP median IE on addition
    expected = int(first.by_class("median")[0, :, POSITION_CLASSES.index("last")].argmax())
    assert llama_run.neuron_layer == expected


def test_pairs_tokenize_on_byte_tokenizer_and_cover_every_format(llama: ModelHandle, llama_run: MediateResult) -> None:
    counts = llama_run.counts
    assert counts["addition"]["rejected_length_mismatch"] == counts["retrieval"]["rejected_length_mismatch"] == 0
    items, _ = mediation_items(llama.tokenizer, CFG, "addition")
    assert sorted(item.pair.format for item in items) == sorted(FORMATS)  # 3 pairs: one per format


def test_resume_reuses_finished_tasks(
    llama: ModelHandle, llama_run: MediateResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, layer = tmp_path / "run", llama_run.neuron_layer

    def neurons_until_retrieval(view: Any, items: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if items[0].pair.task == "retrieval":
            raise RuntimeError("interrupted")
        return neuron_effects(view, items, *args, **kwargs)

    monkeypatch.setattr(mediate_module, "neuron_effects", neurons_until_retrieval)
    with pytest.raises(RuntimeError, match="interrupted"):
        mediate(llama, CFG, out, quiet=True)
    saved = sorted(p.name.rsplit("-", 1)[0] for p in (out / ".partial").iterdir())
    assert saved == sorted([f"{t}-mediation" for t in CFG.tasks] + [f"addition-neurons{layer}"])
    assert not (out / "metadata.json").exists()

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a saved task was recomputed")

    def neurons_except_addition(view: Any, items: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return refuse() if items[0].pair.task == "addition" else neuron_effects(view, items, *args, **kwargs)

    monkeypatch.setattr(mediate_module, "mediation_effects", refuse)
    monkeypatch.setattr(mediate_module, "neuron_effects", neurons_except_addition)
    resumed = mediate(llama, CFG, out, quiet=True)
    assert resumed.metadata["resumed"] == [f"{t}-mediation" for t in CFG.tasks] + [f"addition-neurons{layer}"]
    assert not (out / ".partial").exists()
    for name in ("mediation_by_class.csv", "mediation_total.csv", "neuron_top.csv", "neuron_overlap.csv"):
        assert (out / name).read_text() == (llama_run.out_dir / name).read_text(), name


def test_resume_key_changes_with_model_settings_and_prompts(llama: ModelHandle) -> None:
    items, _ = mediation_items(llama.tokenizer, CFG, "addition")
    key = resume_key("model-a", CFG, "addition", items)
    assert key == resume_key("model-a", MediateConfig(n_pairs=3, few_shot=1, neuron_k=7, max_rows=9), "addition", items)
    assert key != resume_key("model-b", CFG, "addition", items)
    assert key != resume_key("model-a", MediateConfig(n_pairs=3, few_shot=1, seed=1), "addition", items)
    assert key != resume_key("model-a", CFG, "addition", items[:2])


def test_gpt2_attention_only_with_a_given_neuron_layer(tiny_model_dir, tmp_path: Path) -> None:
    handle = load_model(ModelConfig(model=str(tiny_model_dir("gpt2"))))  # learned positions: keep prompts short
    cfg = MediateConfig(n_pairs=2, few_shot=0, layers=(1,), components=("attn",), neuron_layer=0, neuron_k=3)
    result = mediate(handle, cfg, tmp_path / "run", quiet=True)
    assert result.neuron_layer == 0 and all((tmp_path / "run" / name).is_file() for name in FILES)
    check_against_engine(handle, cfg, result)
    check_overlaps(cfg, result.out_dir)


def test_no_neurons_when_k_is_zero(llama: ModelHandle, tmp_path: Path) -> None:
    cfg = MediateConfig(tasks=("addition",), n_pairs=1, few_shot=0, layers=(0,), neuron_k=0)
    result = mediate(llama, cfg, tmp_path / "run", quiet=True)
    assert result.neuron_layer is None and result.neurons == {} and result.overlaps == {}
    assert rows(tmp_path / "run" / "neuron_top.csv") == rows(tmp_path / "run" / "neuron_overlap.csv") == []
    assert len(rows(tmp_path / "run" / "mediation_by_class.csv")) == 2 * 6  # mlp + attn, one layer, 6 classes


BAD_CONFIGS = [
    {"tasks": ()},
    {"tasks": ("addition", "addition")},
    {"tasks": ("poetry",)},
    {"intervention": "swap"},
    {"intervention": "operator"},  # retrieval and factual have no operator
    {"tasks": ("factual",), "intervention": "operands-same-result"},
    {"formats": ("essay",)},
    {"n_pairs": 0},
    {"n_pairs": 2.5},
    {"few_shot": -1},
    {"layers": ()},
    {"layers": (-1,)},
    {"layers": (1, 1)},
    {"components": ("resid",)},
    {"neuron_layer": -2},
    {"neuron_k": -1},
    {"neuron_k": True},
    {"max_rows": 0},
    {"components": ("attn",)},  # the neuron layer is chosen from MLP effects: give it
]


@pytest.mark.parametrize("kwargs", BAD_CONFIGS, ids=[json.dumps(k) for k in BAD_CONFIGS])
def test_bad_config_is_one_config_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        MediateConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"layers": (0, 9)}, {"neuron_layer": 9}, {"neuron_k": 10**6}])
def test_settings_beyond_the_model_fail_before_any_work(llama: ModelHandle, tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        mediate(llama, MediateConfig(n_pairs=1, **kwargs), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()


def test_lists_become_tuples() -> None:
    cfg = MediateConfig(tasks=["addition", "factual"], formats="qa", layers=[0, 2], components=["mlp"])  # type: ignore[arg-type]
    assert cfg.tasks == ("addition", "factual") and cfg.formats == ("qa",) and cfg.layers == (0, 2)
    assert cfg.data("factual").tasks == ("factual",) and cfg.data("factual").n_per_template == cfg.n_pairs
