"""The arithmetic benchmark: scoring equals a direct per-prompt computation; intervals, groups, stage files, errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from arithmech.cli.improve import _arithmetic_detail
from arithmech.data.arithmetic_split import make_split, split_prompts, transfer_prompts
from arithmech.errors import ConfigError
from arithmech.evaluate.arithmetic import AnswerScore, group_rows, score_answers
from arithmech.evaluate.clustered_interval import clustered_wilson
from arithmech.evaluate.runner import EvalOptions, evaluate_benchmark
from arithmech.models.archs import spec_for_model_type
from arithmech.models.load import ModelHandle
from arithmech.models.view import ModelView
from arithmech.stages.evaluate import evaluate_stage
from arithmech.stages.evaluate_config import EvaluateConfig

from tiny_models import make_tiny_model, make_tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
ANSWER_BYTES = [ord(c) for c in "0123456789\n"]


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    """The tiny llama with every unembedding row but the digits' and newline's shrunk: it writes numbers, so
    its greedy answers are digit strings and some of them end (a newline next) -- every branch of the scoring."""
    model = make_tiny_model("llama", seed=0)
    with torch.no_grad():
        keep = torch.zeros(model.lm_head.weight.shape[0], dtype=torch.bool)
        keep[ANSWER_BYTES] = True
        model.lm_head.weight[~keep] *= 0.01
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    return ModelHandle(model, make_tiny_tokenizer(), view, {"model": "tiny-llama-digits"})


def direct(handle: ModelHandle, prompt: str, answer: str) -> AnswerScore:
    """The scoring written out for one prompt: the byte tokenizer has no merges, so the answer starts where the
    prompt's bytes end; one unbatched forward pass of the HF model's own logits."""
    tok = handle.tokenizer
    start = len(tok(prompt)["input_ids"])
    ids = tok(prompt + answer)["input_ids"]
    with torch.no_grad():
        logits = handle.model(input_ids=torch.tensor([ids])).logits[0].float()  # [pos, d_vocab]
    logprobs = logits.log_softmax(-1)
    best = logits.argmax(-1).tolist()
    hits = [best[k - 1] == ids[k] for k in range(start, len(ids))]
    ended = not tok.decode([best[len(ids) - 1]])[:1].isdigit()
    logprob = sum(float(logprobs[k - 1, ids[k]]) for k in range(start, len(ids)))
    return AnswerScore(hits[0], all(hits) and ended, logprob, tok.decode([best[start - 1]]), len(ids) - start,
                       sum(hits))


def greedy_digits(handle: ModelHandle, prompt: str, most: int = 8) -> str:
    """The model's own greedy continuation, up to `most` digits (stops at a non-digit)."""
    text = ""
    for _ in range(most):
        ids = handle.tokenizer(prompt + text)["input_ids"]
        with torch.no_grad():
            nxt = handle.tokenizer.decode([int(handle.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())])
        if not nxt.isdigit():
            break
        text += nxt
    return text


def test_scoring_equals_a_direct_per_prompt_computation(handle: ModelHandle) -> None:
    split = make_split(0)
    prompts = [p.reference for p in split_prompts(split, "test", ("subtraction",), few_shot=1)[:10]]
    prompts += [p.reference for p in transfer_prompts(split, ("addition",), n_per_template=1, few_shot=1)[:6]]
    answers = []
    for i, prompt in enumerate(prompts):  # gold-like, the model's own answer, and its first digit then a wrong one
        own = greedy_digits(handle, prompt) or "7"
        answers += [str(i % 10), own, own[0] + str((int(own[-1]) + 1) % 10)]
    prompts = [p for p in prompts for _ in range(3)]
    scores = score_answers(handle.view, handle.tokenizer, prompts, answers, batch_size=5)
    for prompt, answer, score in zip(prompts, answers, scores, strict=True):
        want = direct(handle, prompt, answer)
        fields = ("first_correct", "exact", "predicted", "n_tokens", "tokens_correct")
        assert [getattr(score, f) for f in fields] == [getattr(want, f) for f in fields], (prompt, answer)
        assert score.logprob == pytest.approx(want.logprob, abs=1e-4)
    assert {s.first_correct for s in scores} == {s.exact for s in scores} == {True, False}  # every branch is hit
    assert any(s.first_correct and not s.exact for s in scores)
    assert any(s.exact and s.n_tokens > 1 for s in scores)  # a multi-digit answer matched in full
    alone = score_answers(handle.view, handle.tokenizer, prompts, answers, batch_size=1)  # no batch-mates, no pads
    assert [(s.first_correct, s.exact) for s in alone] == [(s.first_correct, s.exact) for s in scores]
    assert [s.logprob for s in alone] == pytest.approx([s.logprob for s in scores], abs=1e-4)


def test_groups_count_per_operation_and_formation() -> None:
    records = [{"operation": op, "formation": f, "correct": c, "exact": e, "template_id": t, "a": a, "b": b,
                "n_answer_tokens": 2, "tokens_correct": int(c) + int(e)} for op, f, c, e, t, a, b in (
        ("subtraction", "equation", True, True, "sub-eq-1", 7, 2),
        ("subtraction", "qa", True, False, "sub-qa-1", 5, 1), ("subtraction", "qa", False, False, "sub-qa-2", 9, 4),
        ("addition", "equation", True, True, "add-eq-1", 1, 1))]  # fmt: skip
    rows = {(r["operation"], r["formation"]): r for r in group_rows("b", records)}
    assert list(rows) == [("all", "all"), ("subtraction", "all"), ("subtraction", "equation"), ("subtraction", "qa"),
                          ("addition", "all"), ("addition", "equation")]  # fmt: skip
    assert (rows["all", "all"]["n"], rows["all", "all"]["correct"], rows["all", "all"]["exact"]) == (4, 3, 2)
    sub = rows["subtraction", "qa"]
    assert (sub["n"], sub["accuracy"], sub["exact_accuracy"]) == (2, 0.5, 0.0)
    assert (sub["ci_low"], sub["ci_high"], sub["n_effective"]) == clustered_wilson([True, False], ["q1", "q2"],
                                                                                   ["f1", "f2"])  # fmt: skip
    assert (sub["answer_tokens"], sub["token_accuracy"]) == (4, 0.25)


def test_stage_writes_records_groups_and_split(handle: ModelHandle, tmp_path: Path) -> None:
    cfg = EvaluateConfig(benchmarks=("arithmetic-subtraction", "arithmetic-multidigit-addition"), n_shot=1, limit=24)
    result = evaluate_stage(handle, cfg, tmp_path, quiet=True)
    split = make_split(0)
    records = result.benchmarks["arithmetic-subtraction"].records
    assert len(records) == 24 and {r["operation"] for r in records} == {"subtraction"}
    assert {r["template_id"] for r in records} <= set(split.test_templates)
    assert {(int(r["a"]), int(r["b"])) for r in records} <= set(split.valid_pairs("test", "subtraction"))
    assert len({r["formation"] for r in records}) == 3  # the seeded subset keeps every formation
    on_disk = json.loads((tmp_path / "split.json").read_text())
    assert on_disk == split.record()
    rows = list(csv.DictReader((tmp_path / "arithmetic.csv").open()))
    top = next(r for r in rows if r["benchmark"] == "arithmetic-subtraction" and r["operation"] == "all")
    assert int(top["n"]) == 24 and int(top["correct"]) == sum(r["correct"] for r in records)
    assert int(top["exact"]) == sum(r["exact"] for r in records)
    summary = json.loads((tmp_path / "examples" / "arithmetic-subtraction.summary.json").read_text())["result"]
    assert summary["info"]["split_fingerprint"] == split.fingerprint and summary["info"]["part"] == "test"
    # issue 22.5: a multi-digit benchmark's accuracy is of whole numbers, with the first digit and per digit beside
    multi = result.benchmarks["arithmetic-multidigit-addition"]
    assert multi.info["scored"] == "exact" and multi.correct == sum(r["exact"] for r in multi.records)
    assert multi.info["first_token_correct"] == sum(r["correct"] for r in multi.records) > multi.correct
    tokens = sum(r["n_answer_tokens"] for r in multi.records)
    assert multi.info["token_accuracy"] == sum(r["tokens_correct"] for r in multi.records) / tokens
    listed = {r["benchmark"]: r for r in csv.DictReader((tmp_path / "results.csv").open())}
    assert float(listed["arithmetic-multidigit-addition"]["accuracy"]) == pytest.approx(multi.correct / multi.n)
    assert result.benchmarks["arithmetic-subtraction"].info["scored"] == "first token"  # one-token answers
    line = _arithmetic_detail(multi.info, multi.n)
    assert f"first digit {multi.info['first_token_accuracy']:.1%} ({multi.info['first_token_correct']} of " in line
    again = evaluate_stage(handle, cfg, tmp_path, quiet=True)  # finished benchmarks are read back
    assert json.loads((tmp_path / "metadata.json").read_text())["benchmarks"]["arithmetic-subtraction"]["reused"]
    assert again.benchmarks["arithmetic-subtraction"].records == records


def test_validation_part_asks_train_templates_and_validation_pairs(handle: ModelHandle, tmp_path: Path) -> None:
    cfg = EvaluateConfig(benchmarks=("arithmetic-division",), n_shot=1, arithmetic_part="validation")
    records = evaluate_stage(handle, cfg, tmp_path, quiet=True).benchmarks["arithmetic-division"].records
    split = make_split(0)
    assert {r["template_id"] for r in records} <= set(split.train_templates)
    assert {(int(r["a"]), int(r["b"])) for r in records} <= set(split.valid_pairs("validation", "division"))


def test_bad_arithmetic_settings_are_config_errors(handle: ModelHandle) -> None:
    with pytest.raises(ConfigError, match="test or validation"):
        EvaluateConfig(benchmarks=("arithmetic",), arithmetic_part="train")
    with pytest.raises(ConfigError, match="testing only"):
        EvaluateConfig(benchmarks=("arithmetic-multidigit",), arithmetic_part="validation")
    with pytest.raises(ConfigError, match="0 to 8"):
        evaluate_benchmark(handle, "arithmetic", EvalOptions(n_shot=9))


def test_group_intervals_respect_template_clustering() -> None:
    """Issue #21: 6 templates x 20 problems are not 120 independent prompts. Outcomes fixed by the template
    (3 always right, 3 always wrong) must give an interval far wider than Wilson's on n = 120."""
    records = [{"operation": "subtraction", "formation": "qa", "template_id": f"t{t}", "a": 9, "b": b,
                "correct": t < 3, "exact": t < 3, "n_answer_tokens": 1, "tokens_correct": int(t < 3)}
               for t in range(6) for b in range(10)]  # fmt: skip
    records += [{**r, "a": 8, "b": r["b"] % 9} for r in records]  # 20 problems, of 15 facts
    top = group_rows("b", records)[0]
    naive_low, naive_high = 0.4106, 0.5894  # Wilson(60, 120)
    assert top["accuracy"] == 0.5 and top["n_effective"] < 6
    assert top["ci_low"] < naive_low - 0.2 and top["ci_high"] > naive_high + 0.2
