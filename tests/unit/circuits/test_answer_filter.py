"""The answer filter: a pair is kept only when the model answers both prompts, so that m(full) > 0 > m(empty)."""

from __future__ import annotations

import re

import pytest
import torch

from arithmech.circuits import prompts as circuit_prompts
from arithmech.circuits.batch import CircuitBatch, at_end
from arithmech.circuits.faithfulness import circuit_metrics
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.prompts import answered_pairs, answered_rows
from reference_circuits import tiny_batch, tiny_view

from tiny_models import make_tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _end_logits(view, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        resid = view.final_resid(input_ids=ids, attention_mask=mask, use_cache=False)
    return view.vocab_logits(at_end(resid, mask.sum(-1) - 1))  # [batch, d_vocab]


def test_rows_the_counterfactual_run_does_not_answer_are_dropped() -> None:
    """Row 1's counterfactual answer is the counterfactual prompt's least likely token: the model's clean answer
    is right, so a clean-only filter (main before this change) kept it, and its m(empty) is positive."""
    view = tiny_view("llama")
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    base = tiny_batch()
    clean_logits, cf_logits = _end_logits(view, base.clean_ids, base.mask), _end_logits(view, base.cf_ids, base.mask)
    top_clean, top_cf = clean_logits.argmax(-1), cf_logits.argmax(-1)
    assert bool((top_clean != top_cf).all())  # the two answers differ on every row (the metric has a sign)
    least_cf = cf_logits.argmin(-1)
    answers = torch.stack([top_clean[0], top_clean[1], least_cf[2]])  # row 2: the clean prompt is missed
    cf_answers = torch.stack([top_cf[0], least_cf[1], top_cf[2]])  # row 1: the counterfactual prompt is missed
    batch = CircuitBatch(base.clean_ids, base.cf_ids, base.mask, answers, cf_answers)

    clean_ok, cf_ok = answered_rows(view, batch, batch_size=2)
    assert clean_ok.tolist() == [True, True, False]
    assert cf_ok.tolist() == [True, False, True]

    def metrics(row: int):
        return circuit_metrics(view, graph, batch.select(slice(row, row + 1)), [])

    kept = metrics(0)
    assert kept.m_full > 0 > kept.m_empty  # f runs from 0 (counterfactual behaviour) to 1 (clean behaviour)
    clean_only = metrics(1)  # what the clean-only filter let through
    assert clean_only.m_full > 0 and clean_only.m_empty > 0


def _fake_top_tokens(tokenizer, answered: set[int]):
    """A stand-in model that answers "Q: How much is A plus B? A: " with C's leading digit when A is in
    `answered`, and with "x" otherwise."""

    def top_tokens_at(_view, rows, reads, _pad, _batch_size=32, progress=None):
        out = []
        for row, read in zip(rows, reads, strict=True):
            text = tokenizer.decode(row[: read[0] + 1])
            a, b = (int(x) for x in re.findall(r"\d+", text)[:2])
            digit = str(a + b)[0] if a in answered else "x"
            out.append([tokenizer.convert_tokens_to_ids(digit)])
        return out

    return top_tokens_at


def test_built_in_pairs_are_made_of_answered_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = make_tiny_tokenizer()
    answered = {a for a in range(100) if a % 3}
    monkeypatch.setattr(circuit_prompts, "top_tokens_at", _fake_top_tokens(tok, answered))
    pairs, counts = answered_pairs(None, tok, "addition", 6, seed=0, max_operand=99)  # type: ignore[arg-type]
    assert len(pairs) == counts.kept == counts.pairs == 6
    assert counts.clean_missed == counts.cf_missed == 0
    assert 12 <= counts.prompts_answered <= counts.prompts_drawn
    for pair in pairs:
        a_cf = int(re.findall(r"\d+", pair.counterfactual)[0])
        assert int(pair.a) in answered and a_cf in answered  # type: ignore[arg-type]
        assert pair.extra["answer_id"] != pair.extra["cf_answer_id"]
        assert len(tok(pair.reference)["input_ids"]) == len(tok(pair.counterfactual)["input_ids"])
    assert "6 of 6 pairs pass" in counts.describe()


def test_drawing_stops_when_the_model_answers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = make_tiny_tokenizer()
    monkeypatch.setattr(circuit_prompts, "top_tokens_at", _fake_top_tokens(tok, set()))
    pairs, counts = answered_pairs(None, tok, "addition", 2, seed=0, max_operand=99)  # type: ignore[arg-type]
    assert pairs == [] and counts.prompts_answered == 0
    assert counts.prompts_drawn == circuit_prompts.PROMPTS_PER_PAIR * 2
