"""Every stage on the tiny model of every supported architecture, end to end (issue #13).

Per architecture of `tiny_models.TINY_ARCHS`, one `arithmech run` holds every pipeline stage: identify (exact
path patching), knockout (mean ablation), transfer (generated, decimal and word-problem targets), analyze
attention, analyze mlp, analyze fourier, mediation, agreement (path and attribution), neurons (with a LoRA
adapter), analyze heuristics (grid scan, templates, top vs random neuron ablation), circuit (EAP-IG,
path-patching and random rankings swept; not on Gemma 2/3, whose heads have no output of its own), precise
finetune, evaluate (generation, choice scoring and general text, on the base and the tuned model), and then
`arithmech report`. What one run cannot hold runs as direct stage calls on the same identify folder:
identify's other variants and methods, knockout's other ablation modes and end_only, finetune's full and LoRA
methods. Every folder must be intact (`run_folders.check_intact`) and hold finite numbers
(`run_folders.nonfinite`, whose documented exceptions are the only NaN or empty cells allowed).

The pipeline runs under `grad_guard.GradRecorder`: no stage that only reads activations may build an autograd
graph (on Gemma 2/3 the post-feedforward norm's weight made the MLP update require grad, and analyze mlp
failed on `.numpy()`), while attribution patching and the training loops must still get their gradients.

Sizes are tiny (8 prompts, k <= 2, one training step) and torch runs on one thread: ~7 s of CPU per
architecture.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_demo_offline import SMALL

from arithmech.cli import main
from arithmech.lineage import identify_fingerprint
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.pipeline import STAGES
from arithmech.stages.finetune import finetune
from arithmech.stages.finetune_config import FinetuneConfig
from arithmech.stages.identify import identify
from arithmech.stages.identify_config import IdentifyConfig
from arithmech.stages.knockout import knockout
from arithmech.stages.knockout_config import KnockoutConfig

from grad_guard import GradRecorder
from run_folders import check_intact, nonfinite
from tiny_models import TINY_ARCHS

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),  # peft -> transformers
]

IDENTIFY = SMALL["identify"]
FINETUNE = {"top_k": 2, "batch_size": 4, "micro_batch_size": 4, "max_steps": 1, "target": "answer",
            "chat_template": False}  # fmt: skip
GENERATED_TARGETS = ["addition", "subtraction", "multiplication", "division", "addition-qa",
                     "multidigit-addition", "decimals-addition"]  # fmt: skip
"""Every built-in target set but svamp and gsm8k, whose shortest prompts are longer than the tiny context."""


def _settings(words: Path, train: Path) -> dict[str, Any]:
    """The demo test's small settings, with two random draws (a finite standard deviation), every kind of
    transfer target in one-shot prompts that fit 128 positions, layers every tiny model has, and data files."""
    return {
        **SMALL,
        "knockout": {**SMALL["knockout"], "n_random": 2},
        "transfer": {**SMALL["transfer"], "targets": [*GENERATED_TARGETS, str(words)], "few_shot": 1, "n_random": 2,
                     "limit": 6, "n_per_template": 6},  # fmt: skip
        "neurons": {**SMALL["neurons"], "importance_layers": [0, 1], "n_random": 2},
        "finetune": {**FINETUNE, "data": str(train)},
        "evaluate": {**SMALL["evaluate"], "benchmarks": ["adapters-svamp", "csqa", "general"]},
        "numbers": {"filter_correct": False, "max_pairs": 40, "max_prompts": 6, "layers": [1], "shuffles": 2,
                    "few_shot": 1, "identify_run": "identify", "head_top_k": 3},  # the pipeline fills identify_run
    }


def _write_data(folder: Path) -> tuple[Path, Path]:
    """A word-problem target short enough for the tiny context, and an SFT file."""
    words, train = folder / "words.jsonl", folder / "train.jsonl"
    problems = [{"id": f"w{i}", "question": f"{i} plus 2?", "answer": str(i + 2)} for i in range(8)]
    words.write_text("".join(json.dumps(r) + "\n" for r in problems))
    rows = [{"id": f"t{i}", "question": f"What is {i} plus 1?", "answer": str(i + 1)} for i in range(8)]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return words, train


STAGE_NAMES = [s.name for s in STAGES]


@dataclass(frozen=True)
class ArchRun:
    arch: str
    run: Path
    recorder: GradRecorder
    handle: ModelHandle
    train: Path


@pytest.fixture(scope="module", params=list(TINY_ARCHS))
def arch_run(
    request: pytest.FixtureRequest, tiny_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> ArchRun:
    """`arithmech run` with every stage, then `arithmech report`, on one tiny architecture."""
    arch: str = request.param
    model = tiny_model_dir(arch)
    folder = tmp_path_factory.mktemp(f"matrix-{arch}")
    words, train = _write_data(folder)
    config = folder / "experiment.yaml"
    config.write_text(yaml.safe_dump({"out": str(folder / "run"), "model": {"model": str(model)},
                                      "stages": STAGE_NAMES, **_settings(words, train)}))  # fmt: skip
    with GradRecorder() as recorder:
        assert main(["run", "--config", str(config), "--quiet"]) == 0
    assert main(["report", str(folder / "run")]) == 0
    return ArchRun(arch, folder / "run", recorder, load_model(ModelConfig(model=str(model))), train)


def _check_folder(folder: Path) -> None:
    assert (folder / "metadata.json").is_file(), folder
    check_intact(folder)
    problems = nonfinite(folder)
    assert problems == [], "\n".join(problems)


def test_every_stage_and_the_report(arch_run: ArchRun) -> None:
    for stage in STAGE_NAMES:
        _check_folder(arch_run.run / stage)
    for model in ("base", "tuned"):
        assert (arch_run.run / "evaluate" / model / "results.csv").is_file(), model
    assert (arch_run.run / "report.html").stat().st_size > 0
    transfer = json.loads((arch_run.run / "transfer" / "metadata.json").read_text())["targets"]
    assert all(info["used"] > 0 for info in transfer.values()), transfer  # every target scored


def test_every_stage_records_the_identify_runs_it_read(arch_run: ArchRun) -> None:
    """lineage tells a stale analysis from its record alone: each stage lists the identify runs it read, an
    empty list when its config class says it reads none."""
    fingerprint = identify_fingerprint(arch_run.run / "identify")
    folders = [(stage, arch_run.run / stage.name) for stage in STAGES]
    folders += [(stage, arch_run.run / stage.name / m) for stage in STAGES if stage.name == "evaluate"
                for m in ("base", "tuned")]  # fmt: skip
    for stage, folder in folders:
        metadata = json.loads((folder / "metadata.json").read_text())
        module, name = stage.config.split(":")
        reads = getattr(importlib.import_module(module), name).reads_identify_run(metadata.get("config") or {})
        recorded = [run["fingerprint"] for run in metadata["identify_runs"]]
        assert recorded == ([fingerprint] if reads else []), (folder.name, recorded)
        readers = ("knockout", "transfer", "attention", "mlp", "fourier", "agreement", "finetune",
                   "numbers")  # circuit: EAP-IG; numbers: the Clock's heads
        assert reads == (stage.name in readers), stage.name


def test_read_only_stages_build_no_graph(arch_run: ArchRun) -> None:
    assert arch_run.recorder.unexpected() == []
    assert arch_run.recorder.allowed["graph"] > 0 and arch_run.recorder.allowed["weights"] > 0  # training ran


@pytest.mark.parametrize(("variant", "method"), [("path", "attribution"), ("direct", "both"), ("total", "both")])
def test_identify_variants_and_methods(arch_run: ArchRun, tmp_path: Path, variant: str, method: str) -> None:
    """With the pipeline's path/exact: every variant by both engines, and each method alone."""
    cfg = IdentifyConfig(**{**IDENTIFY, "formations": ("equation",)}, variant=variant, method=method)
    identify(arch_run.handle, cfg, tmp_path / "identify", quiet=True)
    _check_folder(tmp_path / "identify")


@pytest.mark.parametrize(
    ("ablation", "end_only"), [("zero", False), ("resample", False), ("mean", True), ("zero", True), ("resample", True)]
)
def test_knockout_ablation_modes(arch_run: ArchRun, tmp_path: Path, ablation: str, end_only: bool) -> None:
    cfg = KnockoutConfig(from_run=str(arch_run.run / "identify"), ablation=ablation, end_only=end_only, max_k=2,
                         n_random=2, max_prompts=4)  # fmt: skip
    knockout(arch_run.handle, cfg, tmp_path / "knockout", quiet=True)
    _check_folder(tmp_path / "knockout")


@pytest.mark.parametrize("method", ["full", "lora"])
def test_finetune_methods(arch_run: ArchRun, tmp_path: Path, method: str) -> None:
    cfg = FinetuneConfig(**FINETUNE, method=method, data=str(arch_run.train), lora_r=2)
    finetune(arch_run.handle, cfg, tmp_path / "finetune", quiet=True)
    _check_folder(tmp_path / "finetune")
