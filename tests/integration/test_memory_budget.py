"""A budget every stage keeps (issue #33): under a max_memory that forces it to split its work, every stage gives
the numbers it gives without one, to 1e-6 in float32.

Each stage runs twice on the tiny Llama through the Python API (which fits the sizes as the commands and `run` do,
plan/budget.py): as configured, and under the planned peak of its sizes with the knob (batch_size, mediation's
max_rows, finetune's micro_batch_size) at `target`, below its prompt or row count, so the budgeted run makes more,
smaller passes. The budgeted run must record that it lowered the knob to `target` (the planned peak grows with
it, so the bisection lands there) and ran with it, and every result file must match the first run's
(`run_folders.assert_close_results`: CSV cells, JSON values and tensors). The settings are small (a few prompts,
one training step), the identify run is shared, and figures are written as empty placeholders (`no_drawing`):
drawing them was most of the time, and they hold no number.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import arithmech as am
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.pipeline import build_stage_config, stage_by_name
from arithmech.plan.budget import of_loaded
from arithmech.plan.planner import DEFAULT_TOKENS
from arithmech.plan.prompt_widths import READS_IDENTIFY

from run_folders import assert_close_results

pytestmark = pytest.mark.usefixtures("one_thread", "no_drawing")

TOLERANCE = 1e-6
RATIOS_OF_DROPS = {"share_of_drop": 1e-5}
"""neurons' share of the drop: a ratio of sums of probability drops (about 0.03 on the tiny model), so its inputs'
float32 noise (3e-8, from the passes' batch shapes) comes out about 30 times larger (1.03e-6 on one CPU)."""
PNG = b"\x89PNG\r\n\x1a\n" + b"IEND\xaeB`\x82"
IDENTIFY = {"filter_correct": False, "max_prompts": 8, "n_per_template": 2, "formations": ["equation"]}


@dataclass(frozen=True)
class Case:
    """A stage, its API function, small settings, and the knob the budget lowers to `target`."""

    stage: str
    run: Callable[..., Any]
    settings: dict[str, Any]
    knob: str
    target: int
    reads_run: bool = True


CASES = [
    Case("knockout", am.knockout, {"max_k": 2, "n_random": 1, "max_prompts": 4}, "batch_size", 4),
    Case("transfer", am.transfer, {"targets": ["subtraction"], "n_random": 1, "max_prompts": 4, "n_per_template": 2,
                                   "filter_correct": False}, "batch_size", 4),  # fmt: skip
    Case("attention", am.analyze_attention, {"max_prompts": 4, "n_examples": 1}, "batch_size", 2),
    Case("mlp", am.analyze_mlp, {"max_prompts": 4}, "batch_size", 2),
    Case("fourier", am.analyze_fourier, {"max_prompts": 4, "cutoffs": [1]}, "batch_size", 2),
    Case("agreement", am.analyze_agreement, {"max_prompts": 4, "methods": ["path", "attribution"]}, "batch_size", 2),
    Case("mediation", am.mediate, {"tasks": ["addition"], "formats": ["equation"], "n_pairs": 2, "neuron_k": 3},
         "max_rows", 64, reads_run=False),  # fmt: skip
    Case("neurons", am.neurons, {"max_prompts": 2, "filter_correct": False, "importance_layers": [1, 2],
                                 "keep_sizes": [0, 8], "n_random": 1, "lora": False, "top_neurons": 4, "top_heads": 2,
                                 "few_shot": 1}, "batch_size", 8, reads_run=False),  # fmt: skip
    Case("heuristics", am.analyze_heuristics, {"operations": ["addition"], "filter_correct": False, "few_shot": 1,
                                               "max_pairs": 12, "layers": [1], "ks": [1, 2], "n_random": 2,
                                               "top_neurons": 2, "batch_size": 8}, "batch_size", 2,
         reads_run=False),  # fmt: skip
    Case("numbers", am.analyze_numbers, {"filter_correct": False, "max_pairs": 40, "max_prompts": 6, "layers": [1],
                                         "shuffles": 1, "few_shot": 1}, "batch_size", 2, reads_run=False),  # fmt: skip
    Case("circuit", am.circuit, {"keep_incorrect": True, "n_prompts": 4, "min_prompts": 2, "steps": 2,
                                 "batch_size": 4}, "batch_size", 1, reads_run=False),  # fmt: skip
    Case("finetune", am.finetune, {"top_k": 2, "data": "arithmetic", "operations": ["subtraction"], "batch_size": 4,
                                   "micro_batch_size": 4, "max_steps": 2, "target": "answer"},
         "micro_batch_size", 1),  # fmt: skip
    Case("evaluate", am.evaluate, {"benchmarks": ["adapters-svamp", "csqa", "general"], "limit": 4, "n_shot": 0,
                                   "general_max_tokens": 32}, "batch_size", 2, reads_run=False),  # fmt: skip
]


@pytest.fixture(scope="module")
def no_drawing() -> Iterator[None]:
    """Figures saved as the smallest PNG and SVG files that parse (`run_folders.check_intact`), undrawn."""
    from matplotlib.figure import Figure

    def placeholder(self: Figure, handle: Any, format: str = "png", **kwargs: Any) -> None:
        handle.write(b"<svg xmlns='http://www.w3.org/2000/svg'/>" if format == "svg" else PNG)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", placeholder)
        yield


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[[str], Path]) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def handle(model_dir: Path) -> ModelHandle:
    return load_model(ModelConfig(model=str(model_dir)))


@pytest.fixture(scope="module")
def identify_run(handle: ModelHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("budget") / "identify"
    am.identify(handle, out=out, quiet=True, **IDENTIFY)
    return out


def budget_for(handle: ModelHandle, stage: str, settings: dict[str, Any], knob: str, target: int,
               identify_run: Path | None = None) -> int:  # fmt: skip
    """The planned peak of the stage's sizes with `knob` at `target`, at the widest prompt of the identify run it
    reads: the budget that lowers it there."""
    cfg = build_stage_config(stage_by_name(stage), settings, 0)
    return of_loaded(handle, None).reading(identify_run).peak(dataclasses.replace(cfg, **{knob: target}))


def check_split(out: Path, knob: str, asked: int, target: int) -> None:
    """The budgeted run lowered `knob` from `asked` to `target`, said so in metadata.json, and ran with it."""
    metadata = json.loads((out / "metadata.json").read_text())
    record = metadata["memory_budget"]
    assert record["lowered"] == {knob: {"from": asked, "to": target}}, record
    assert record["planned_peak"] <= record["max_memory"]
    assert metadata["config"][knob] == target == record["sizes"][knob]


def test_identify_under_a_budget_gives_the_same_numbers(handle: ModelHandle, identify_run: Path,
                                                        tmp_path: Path) -> None:  # fmt: skip
    budget = budget_for(handle, "identify", IDENTIFY, "batch_size", 2)
    am.identify(handle, out=tmp_path / "identify", quiet=True, max_memory=budget, **IDENTIFY)
    check_split(tmp_path / "identify", "batch_size", 16, 2)
    assert_close_results(tmp_path / "identify", identify_run, TOLERANCE)


@pytest.mark.parametrize("case", CASES, ids=[c.stage for c in CASES])
def test_every_stage_under_a_budget_gives_the_same_numbers(
    case: Case, handle: ModelHandle, model_dir: Path, identify_run: Path, tmp_path: Path
) -> None:
    def run(out: Path, **budget: Any) -> None:
        model = load_model(ModelConfig(model=str(model_dir))) if case.stage == "finetune" else handle  # trains it
        case.run(model, *source, out=out, quiet=True, **case.settings, **budget)

    source = (identify_run,) if case.reads_run else ()
    asked = getattr(build_stage_config(stage_by_name(case.stage), case.settings, 0), case.knob)
    assert case.target < asked
    run(tmp_path / "plain")
    budget = budget_for(handle, case.stage, case.settings, case.knob, case.target, source[0] if source else None)
    run(tmp_path / "split", max_memory=budget)
    check_split(tmp_path / "split", case.knob, asked, case.target)
    assert json.loads((tmp_path / "plain" / "metadata.json").read_text())["memory_budget"]["lowered"] == {}
    assert_close_results(tmp_path / "split", tmp_path / "plain", TOLERANCE, looser=RATIOS_OF_DROPS)


READERS = {"identify": (am.identify, IDENTIFY),
           "knockout": (am.knockout, {"max_k": 1, "n_random": 1, "max_prompts": 8}),
           "transfer": (am.transfer, {"targets": ["addition", "subtraction"], "n_random": 1, "max_prompts": 8,
                                      "n_per_template": 2, "filter_correct": False}),
           "attention": (am.analyze_attention, {"max_prompts": 8, "n_examples": 1}),
           "mlp": (am.analyze_mlp, {"max_prompts": 8}),
           "fourier": (am.analyze_fourier, {"max_prompts": 8, "cutoffs": [1]}),
           "agreement": (am.analyze_agreement, {"max_prompts": 8, "methods": ["path", "attribution"]}),
           **{case.stage: (case.run, case.settings) for case in CASES
              if case.stage in ("mediation", "neurons", "heuristics", "numbers", "circuit")}}  # fmt: skip
"""Identify, the stages that read an identify run's prompts (with every one of its 8 prompts scored), and those that
make their own."""
SHARE_A_PREFIX = ("knockout", "transfer", "mediation", "neurons", "heuristics", "numbers", "circuit")
"""Stages that embed a sample of what was read, or run the tokens their prompts share once and the rest apart (the
plan counts those tokens in every row's keys and values: `models/shared_prefix.py`)."""


@pytest.mark.parametrize("stage", list(READERS))
def test_a_stage_plans_at_the_widest_prompt_it_embeds(
    stage: str, handle: ModelHandle, identify_run: Path, tmp_path: Path
) -> None:
    """The budget plans these stages at the widest prompt they will embed, read from the run folder before the
    weights load (plan/prompt_widths.py) or made by the stage's own code: identify's answer check runs each of its
    prompts with its answer, and the analyses score all of the run's prompts, so exactly that; where a stage embeds
    a sample or a prompt's last tokens apart (SHARE_A_PREFIX), never less. Without the folder the analyses' plan
    keeps the assumed width."""
    run, settings = READERS[stage]
    widths: list[int] = []
    hook = handle.model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _out: widths.append(args[0].shape[-1]))  # fmt: skip
    try:
        source = [identify_run] if stage in READS_IDENTIFY else []
        run(handle, *source, out=tmp_path / stage, quiet=True, **settings)
    finally:
        hook.remove()
    cfg = build_stage_config(stage_by_name(stage), settings, 0)
    budget = of_loaded(handle, None)
    read = budget.reading(identify_run).plan(cfg).tokens
    recorded = json.loads((tmp_path / stage / "metadata.json").read_text())["memory_budget"]["prompt_tokens"]
    assert recorded == read
    if stage in SHARE_A_PREFIX:
        assert max(widths) <= read
    else:
        assert max(widths) == read
    if stage in READS_IDENTIFY and stage not in ("knockout", "transfer"):  # the others name their run in their config
        assert budget.plan(cfg).tokens == DEFAULT_TOKENS
