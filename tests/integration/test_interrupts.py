"""Ctrl-C during any pipeline stage: nothing half-written is left, and a rerun gives the uninterrupted results.

Each stage of `pipeline.STAGES` runs on the tiny llama three times into the same run folder path: once without
a fault (the reference, which also counts its forward passes and atomic writes), once stopped by a
KeyboardInterrupt half way through its forward passes or half way through its writes (chunks in .partial/,
then results, its metadata.json last; the run then adds the memory budget to it and writes pipeline.json), and
once more without a fault. After the interruption every file parses, no temporary file is
left, and pipeline.json does not count the stage as done; the rerun's tables equal the reference's number for
number (timings and timestamps aside).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from arithmech import pipeline
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.pipeline import load_run_config, run_pipeline

from run_folders import Faults, assert_same_results, check_intact, results

pytestmark = pytest.mark.usefixtures("one_thread")

IDENTIFY = {"filter_correct": False, "formations": ["equation"], "n_per_template": 2, "batch_size": 2}
SETTINGS: dict[str, dict[str, Any]] = {
    "identify": IDENTIFY,
    "knockout": {"max_k": 2, "n_random": 1, "max_prompts": 4, "batch_size": 8},
    "transfer": {"targets": ["addition-equation"], "n_random": 1, "n_per_template": 2, "max_prompts": 4,
                 "filter_correct": False, "k": 2, "batch_size": 8},
    "attention": {"max_prompts": 4, "batch_size": 2, "n_examples": 1},
    "mlp": {"max_prompts": 4, "batch_size": 2},
    "fourier": {"max_prompts": 4, "batch_size": 2, "cutoffs": [1, 3]},
    "mediation": {"tasks": ["addition"], "n_pairs": 2, "few_shot": 1, "neuron_k": 3},
    "agreement": {"methods": ["path", "attribution"], "max_prompts": 4, "batch_size": 2},
    "neurons": {"operations": ["addition", "subtraction"], "max_prompts": 3, "filter_correct": False, "few_shot": 1,
                "top_heads": 2, "top_neurons": 4, "keep_sizes": [0, 8], "n_random": 2, "lora_steps": 2,
                "lora_rank": 2},
    "heuristics": {"operations": ["addition"], "filter_correct": False, "few_shot": 1, "max_pairs": 8, "layers": [1],
                   "ks": [1], "n_random": 1, "top_neurons": 2, "batch_size": 4},
    "numbers": {"filter_correct": False, "max_pairs": 40, "max_prompts": 6, "layers": [1], "shuffles": 2,
                "few_shot": 1, "identify_run": "identify", "head_top_k": 2, "batch_size": 4},
    "circuit": {"keep_incorrect": True, "n_prompts": 2, "percents": [1, 10, 100], "batch_size": 2, "steps": 2,
                "evaluate": True, "compare_methods": ["path-patching", "random"]},
    "finetune": {"top_k": 2, "batch_size": 4, "micro_batch_size": 2, "max_steps": 2, "target": "answer",
                 "chat_template": False, "lr": 0.01},
    "evaluate": {"n_shot": 0, "max_new_tokens": 3},
}  # fmt: skip
STAGE_NAMES = [stage.name for stage in pipeline.STAGES]


def test_every_stage_is_covered() -> None:
    assert list(SETTINGS) == STAGE_NAMES


@dataclass
class World:
    """The tiny model, data files, a finished identify run, and each stage's reference run (made on demand)."""

    handle: ModelHandle
    model: Path
    root: Path
    settings: dict[str, dict[str, Any]]
    references: dict[str, tuple[Path, dict[str, int]]] = field(default_factory=dict)

    @property
    def run(self) -> Path:
        """The one run folder path every run uses, so paths recorded in results are the same."""
        return self.root / "run"

    def config(self, stage: str, **overrides: Any) -> pipeline.RunConfig:
        return load_run_config(None, {"out": str(self.run), "model": {"model": str(self.model)}, "stages": stage,
                                      **self.settings, **overrides})  # fmt: skip

    def fresh_run(self, stage: str) -> Path:
        """The run folder with only a finished identify stage in it (empty for identify itself)."""
        shutil.rmtree(self.run, ignore_errors=True)
        if stage == "identify":
            self.run.mkdir()
        else:
            shutil.copytree(self.root / "base", self.run)
        return self.run

    def reference(self, stage: str, faults: Faults) -> tuple[Path, dict[str, int]]:
        """The stage run without a fault (moved aside afterwards) and its counts of forward passes and writes."""
        if stage not in self.references:
            self.fresh_run(stage)
            with faults.armed():
                run_pipeline(self.config(stage), quiet=True, handle=self.handle)
            kept = self.root / f"reference-{stage}"
            self.run.rename(kept)
            self.references[stage] = (kept, dict(faults.counts))
        return self.references[stage]


@pytest.fixture(scope="module")
def world(tiny_model_dir, tmp_path_factory: pytest.TempPathFactory) -> World:
    model = tiny_model_dir("llama")
    root = tmp_path_factory.mktemp("interrupts")
    rows = [{"id": f"t{i}", "question": f"What is {i} plus 1?", "answer": str(i + 1), "rationale": f"{i} + 1."}
            for i in range(8)]  # fmt: skip
    files = {"train": rows, "bench-a": rows[:2], "bench-b": rows[2:4]}
    for name, content in files.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in content))
    settings = {
        **SETTINGS,
        "finetune": {**SETTINGS["finetune"], "data": str(root / "train.jsonl")},
        "evaluate": {**SETTINGS["evaluate"], "benchmarks": [str(root / "bench-a.jsonl"), str(root / "bench-b.jsonl")]},
    }
    world = World(load_model(ModelConfig(model=str(model))), model, root, settings)
    run_pipeline(world.config("identify", out=str(root / "base")), quiet=True, handle=world.handle)
    return world


@pytest.fixture
def faults(world: World, monkeypatch: pytest.MonkeyPatch) -> Faults:
    return Faults(monkeypatch, world.handle.model.model.layers[0])


def _record(run: Path) -> dict[str, Any]:
    path = run / "pipeline.json"
    return json.loads(path.read_text()).get("stages", {}) if path.is_file() else {}


@pytest.mark.parametrize("point", ["forward", "write", "last-write"])
@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_interrupted_stage_reruns_to_the_same_results(world: World, faults: Faults, stage: str, point: str) -> None:
    """Stopped half way through the forward passes, half way through the writes, or at the stage's last write
    (its metadata.json, every other result already in place)."""
    reference, counts = world.reference(stage, faults)
    kind = "forward" if point == "forward" else "write"
    last = counts[kind] - 2 * (kind == "write")  # after the stage: its budget's record (metadata.json), pipeline.json
    n = last if point == "last-write" else last // 2 + 1
    assert 1 <= n <= last, counts
    run = world.fresh_run(stage)
    cfg = world.config(stage)
    with faults.armed(kind, n), pytest.raises(KeyboardInterrupt):
        run_pipeline(cfg, quiet=True, handle=world.handle)
    assert faults.fired == kind
    assert count_hooks(world.handle.model) == 0
    check_intact(run)
    assert not (run / stage / "metadata.json").exists()  # the stage's folder reads as unfinished
    assert stage not in _record(run)

    run_pipeline(cfg, quiet=True, handle=world.handle)
    assert not (run / stage / ".partial").exists()
    assert_same_results(run / stage, reference / stage)


def test_a_stage_stopped_before_its_record_is_written_runs_again(world: World, monkeypatch) -> None:
    """A finished stage's folder is newer than pipeline.json until the record is written: if the run stops in
    between, the next run must not keep that folder under the old record's fingerprint."""
    run = world.fresh_run("knockout")  # identify finished with the base settings
    expected = results(run / "identify")
    real = pipeline.atomic_write_json

    def stopped_once_identify_is_done(path: Any, obj: Any) -> None:
        if "identify" in obj.get("stages", {}):
            raise KeyboardInterrupt
        real(path, obj)

    monkeypatch.setattr(pipeline, "atomic_write_json", stopped_once_identify_is_done)
    with pytest.raises(KeyboardInterrupt):  # other settings: identify runs into the folder, then is stopped
        run_pipeline(world.config("identify", seed=1), quiet=True, handle=world.handle)
    assert results(run / "identify") != expected
    monkeypatch.undo()

    ran = run_pipeline(world.config("identify"), quiet=True, handle=world.handle)  # the base settings again
    assert not isinstance(ran["identify"], Path)  # rerun, not kept
    assert results(run / "identify") == expected


def test_evaluate_ignores_an_unfinished_finetune(world: World, faults: Faults) -> None:
    """finetune stopped just before its metadata.json: its delta files exist, but evaluate must not use them."""
    _, counts = world.reference("finetune", faults)
    run = world.fresh_run("finetune")
    with faults.armed("write", counts["write"] - 2), pytest.raises(KeyboardInterrupt):  # the stage's last write
        run_pipeline(world.config("finetune"), quiet=True, handle=world.handle)
    assert (run / "finetune" / "delta.json").is_file() and not (run / "finetune" / "metadata.json").exists()
    ran = run_pipeline(world.config("evaluate"), quiet=True, handle=world.handle)
    assert set(ran["evaluate"]) == {"base"} and not (run / "evaluate" / "tuned").exists()
