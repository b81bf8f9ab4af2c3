"""The lm-evaluation-harness bridge on a tiny model and toy task YAMLs (local JSONL, no hub): lm-eval's numbers
against a direct computation, the files it writes, resume, seeds, and its one-sentence errors."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from arithmech.errors import ConfigError
from arithmech.evaluate import harness
from arithmech.evaluate.harness import HarnessOptions, main_scores, run_harness, task_manager
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.pipeline import load_run_config
from arithmech.stages.evaluate_config import DEFAULT_BENCHMARKS, EvaluateConfig

from harness_tasks import (
    CHOICE_TASK,
    GENERATION_TASK,
    choice_rows,
    direct_greedy,
    direct_loglikelihood,
    write_choice_task,
    write_generation_task,
)

pytestmark = pytest.mark.usefixtures("one_thread")
IDENTITY = {"model": "tiny-llama"}


@pytest.fixture(scope="module")
def handle(tiny_model_dir: Callable[[str], Path]) -> ModelHandle:
    return load_model(ModelConfig(model=str(tiny_model_dir("llama"))))


@pytest.fixture(scope="module")
def tasks(handle: ModelHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A choice task, and a generation task whose even rows' answers are the model's own greedy text (so
    exact_match is 0.5 exactly when lm-eval generates what plain greedy decoding does)."""
    folder = tmp_path_factory.mktemp("tasks")
    write_choice_task(folder, choice_rows())
    rows = []
    for i in range(6):
        question = f"{i}+{i + 3}"
        greedy = direct_greedy(handle.model, handle.tokenizer, f"{question}=")
        rows.append({"question": question, "answer": greedy if i % 2 == 0 else greedy + "x"})
    return write_generation_task(folder, rows)


def options(tasks: Path, *names: str, **changes: Any) -> HarnessOptions:
    return HarnessOptions(tasks=names, include_path=str(tasks), batch_size=3, **changes)


def read_samples(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_choice_loglikelihoods_match_a_direct_forward_pass(handle: ModelHandle, tasks: Path, tmp_path: Path) -> None:
    result = run_harness(handle, options(tasks, CHOICE_TASK), tmp_path, IDENTITY)[CHOICE_TASK]
    samples = read_samples(tmp_path / result.samples[CHOICE_TASK])
    assert len(samples) == len(choice_rows())
    hits, hits_norm = [], []
    for sample in samples:
        choices = sample["doc"]["choices"]
        assert [a[1] for a in sample["arguments"]] == [" " + c for c in choices]
        direct = [direct_loglikelihood(handle.model, handle.tokenizer, ctx, cont) for ctx, cont in sample["arguments"]]
        reported = [ll for ll, _greedy in sample["filtered_resps"]]
        assert reported == pytest.approx(direct, abs=1e-4)
        assert len(set(np.round(direct, 3))) == len(direct), "choices must score differently for a real check"
        hits.append(int(np.argmax(direct)) == sample["target"])
        hits_norm.append(int(np.argmax(np.array(direct) / [len(c) for c in choices])) == sample["target"])
        assert sample["acc"] == hits[-1] and sample["acc_norm"] == hits_norm[-1]
    score = result.scores[0]
    assert (score.task, score.metric, score.n) == (CHOICE_TASK, "acc,none", len(samples))
    assert score.value == pytest.approx(np.mean(hits)) and score.accuracy_norm == pytest.approx(np.mean(hits_norm))
    assert score.correct == sum(hits)
    stored = json.loads((tmp_path / "results.json").read_text())["tasks"][CHOICE_TASK]
    assert stored["results"][CHOICE_TASK]["acc,none"] == pytest.approx(np.mean(hits))
    assert stored["configs"][CHOICE_TASK]["output_type"] == "multiple_choice" and stored["config"]["random_seed"] == 0


def test_generations_match_greedy_decoding(handle: ModelHandle, tasks: Path, tmp_path: Path) -> None:
    result = run_harness(handle, options(tasks, GENERATION_TASK), tmp_path, IDENTITY)[GENERATION_TASK]
    samples = read_samples(tmp_path / result.samples[GENERATION_TASK])
    for sample in samples:
        context = sample["arguments"][0][0]
        assert sample["filtered_resps"] == [direct_greedy(handle.model, handle.tokenizer, context)]
    assert [s["exact_match"] for s in samples] == [1.0, 0.0] * 3
    assert (result.scores[0].metric, result.scores[0].value, result.scores[0].correct) == ("exact_match,none", 0.5, 3)


def test_limit_keeps_the_first_documents(handle: ModelHandle, tasks: Path, tmp_path: Path) -> None:
    result = run_harness(handle, options(tasks, CHOICE_TASK, limit=3), tmp_path, IDENTITY)[CHOICE_TASK]
    samples = read_samples(tmp_path / result.samples[CHOICE_TASK])
    assert [s["doc"] for s in samples] == choice_rows()[:3] and result.scores[0].n == 3


def test_rerun_reuses_finished_tasks_and_reruns_changed_or_broken_ones(
    handle: ModelHandle, tasks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    both = options(tasks, CHOICE_TASK, GENERATION_TASK, limit=4)
    first = run_harness(handle, both, tmp_path, IDENTITY)
    record = (tmp_path / "results.json").read_text()
    real, ran = harness._simple_evaluate, []

    def counting(lm: Any, name: str, *args: Any) -> dict[str, Any]:
        ran.append(name)
        return real(lm, name, *args)

    monkeypatch.setattr(harness, "_simple_evaluate", counting)
    again = run_harness(handle, both, tmp_path, IDENTITY)
    assert ran == [] and all(r.reused for r in again.values())
    assert (tmp_path / "results.json").read_text() == record
    assert {n: r.scores for n, r in again.items()} == {n: r.scores for n, r in first.items()}

    samples = tmp_path / first[GENERATION_TASK].samples[GENERATION_TASK]
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:-1]))  # an incomplete file
    run_harness(handle, both, tmp_path, IDENTITY)
    assert ran == [GENERATION_TASK] and len(read_samples(samples)) == 4
    run_harness(handle, options(tasks, CHOICE_TASK, limit=2), tmp_path, IDENTITY)
    run_harness(handle, options(tasks, CHOICE_TASK, limit=2), tmp_path, {"model": "another"})
    assert ran == [GENERATION_TASK, CHOICE_TASK, CHOICE_TASK]
    assert list(json.loads((tmp_path / "results.json").read_text())["tasks"]) == [CHOICE_TASK]


def test_same_seed_same_prompts_and_global_rng_left_alone(handle: ModelHandle, tasks: Path, tmp_path: Path) -> None:
    def contexts(seed: int, out: str) -> list[str]:
        shots = options(tasks, CHOICE_TASK, limit=4, num_fewshot=2, seed=seed)
        result = run_harness(handle, shots, tmp_path / out, IDENTITY)[CHOICE_TASK]
        return [s["arguments"][0][0] for s in read_samples(tmp_path / out / result.samples[CHOICE_TASK])]

    random.seed(123)
    np.random.seed(123)
    torch.manual_seed(123)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    seed0 = contexts(0, "a")
    assert random.getstate() == states[0] and (np.random.get_state()[1] == states[1]).all()
    assert torch.equal(torch.get_rng_state(), states[2])
    assert seed0 == contexts(0, "b")
    assert seed0 != contexts(1, "c")
    assert all(context.count("\n\n") == 2 for context in seed0)  # two solved examples, then the question


@pytest.mark.slow  # indexes lm-eval's own ~15k task configs
def test_unknown_task_is_one_sentence_with_close_matches(tasks: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        task_manager(["toy_mcq"], str(tasks))
    message = str(caught.value)
    assert message.startswith("unknown lm-eval task 'toy_mcq'; close matches: ") and CHOICE_TASK in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match="unknown lm-eval task 'arc_esay'; close matches: arc_easy"):
        EvaluateConfig(harness_tasks=("arc_esay",), harness_include_path=str(tasks))  # lm-eval's own tasks too


def test_missing_lm_eval_says_how_to_install(tasks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now raises ImportError
    with pytest.raises(ConfigError, match=r"not installed; pip install 'arithmech\[lm-eval\]'$"):
        EvaluateConfig(harness_tasks=(CHOICE_TASK,), harness_include_path=str(tasks))


def test_harness_tasks_replace_the_default_benchmarks(tasks: Path) -> None:
    only = EvaluateConfig(harness_tasks=f"{CHOICE_TASK}, {GENERATION_TASK}", harness_include_path=str(tasks))
    assert only.benchmarks == () and only.harness_tasks == (CHOICE_TASK, GENERATION_TASK)
    both = EvaluateConfig(benchmarks=("gsm8k",), harness_tasks=(CHOICE_TASK,), harness_include_path=str(tasks))
    assert both.benchmarks == ("gsm8k",)
    assert EvaluateConfig().benchmarks == DEFAULT_BENCHMARKS
    assert both.harness_options() == HarnessOptions(tasks=(CHOICE_TASK,), include_path=str(tasks))
    run = load_run_config(overrides={"stages": "evaluate", "evaluate.harness_tasks": [CHOICE_TASK],
                                     "evaluate.harness_include_path": str(tasks)})  # fmt: skip
    assert run.settings["evaluate"].harness_tasks == (CHOICE_TASK,) and run.settings["evaluate"].benchmarks == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"benchmarks": ()}, "no benchmark given"),
        ({"harness_tasks": ("a", "a")}, "names one task twice"),
        ({"harness_include_path": "."}, "apply to harness tasks"),
        ({"harness_tasks": ("a",), "harness_include_path": "/no/such/folder"}, "is not a folder"),
        ({"harness_tasks": ("a",), "harness_num_fewshot": -1}, "must be 0 or more"),
    ],
)
def test_bad_harness_config_is_config_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EvaluateConfig(**kwargs)


def test_main_scores_of_a_group_and_its_tasks() -> None:
    output = {
        "results": {
            "grp": {"alias": "grp", "acc,none": 0.5, "acc_stderr,none": "N/A"},
            "t1": {"alias": " - t1", "acc,none": 0.25, "acc_stderr,none": 0.1, "acc_norm,none": 0.75},
            "t2": {"alias": " - t2", "exact_match,strict": 1.0, "exact_match,loose": 0.0, "bleu,strict": float("nan")},
            "bare": {"alias": "bare"},
        },
        "group_subtasks": {"grp": ["t1", "t2"]},
        "n-samples": {"t1": {"original": 9, "effective": 4}, "t2": {"original": 2, "effective": 2}},
    }
    found = {s.task: (s.metric, s.value, s.n, s.accuracy_norm, s.correct) for s in main_scores(output)}
    assert found == {
        "grp": ("acc,none", 0.5, 6, None, 3),
        "t1": ("acc,none", 0.25, 4, 0.75, 1),
        "t2": ("exact_match,strict", 1.0, 2, None, 2),
    }
