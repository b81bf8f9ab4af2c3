"""The END-only knockout on a shared prefix gives what full forward passes give: END predictions and scores."""

from __future__ import annotations

import pytest
import torch

from arithmech.data import PromptPair, tokenize_pairs
from arithmech.knockout.ablation import ablation_sources
from arithmech.knockout.batched import knockout_scores
from arithmech.knockout.end_only import end_knockout_scores, end_states
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelConfig, load_model
from arithmech.models.predictions import predict_at_end
from arithmech.models.shared_prefix import common_prefix_length
from arithmech.models.sites import Component
from arithmech.patching.path import PatchingBatch

PREFIX = "Question: 2 and 3?\nAnswer: 5\n\nQuestion: 4 and 1?\nAnswer: 5\n\n"


def test_matches_full_forward_passes(tiny_model_dir) -> None:
    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama"))))
    questions = ["1 and 7", "12 and 30", "5 and 5 and 5", "8 and 0", "33 and 4", "6 and 2 more"]
    pairs = []
    for i, q in enumerate(questions):
        prompt = f"{PREFIX}Question: {q}?\nAnswer: "
        pairs.append(PromptPair(prompt, prompt, str(i)))
    t, _ = tokenize_pairs(handle.tokenizer, pairs, counterfactual_required=False)  # as transfer's word problems
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    p = common_prefix_length(batch.ref_ids, batch.end)
    assert p == len(PREFIX) + len("Question: ") + 1 - 1  # bytes; questions differ from their first character
    full = predict_at_end(handle.view, batch.ref_ids, batch.ref_mask, batch.end, batch.answer_ids, 4)
    cached, values = end_states(handle.view, batch, p, batch_size=4)
    assert torch.equal(full.top_token, cached.top_token)
    torch.testing.assert_close(cached.answer_prob, full.answer_prob, atol=1e-5, rtol=1e-4)

    configs = [[], [Component(0, 1), Component(1, 3)], [Component(1)], [Component(0, 0), Component(0)]]
    mean = ablation_sources(handle.view, batch, "mean", [0] * len(batch), end_only=True)  # cf == ref here
    expected = knockout_scores(handle.view, batch, mean, configs, batch_size=5)
    got = end_knockout_scores(handle.view, batch, values.mean(), configs, p, batch_size=5)
    assert torch.equal(got.correct, expected.correct)
    torch.testing.assert_close(got.answer_prob, expected.answer_prob, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got.answer_prob[1], got.answer_prob[0])  # the knockout did something
    whole = end_knockout_scores(handle.view, batch, values.mean(), configs, 0, batch_size=9)  # no cache
    torch.testing.assert_close(whole.answer_prob, expected.answer_prob, atol=1e-5, rtol=1e-4)
    zero = ablation_sources(handle.view, batch, "zero", [0] * len(batch), end_only=True)
    expected = knockout_scores(handle.view, batch, zero, configs, batch_size=7)
    got = end_knockout_scores(handle.view, batch, values.zeros(), configs, p, batch_size=7)
    torch.testing.assert_close(got.answer_prob, expected.answer_prob, atol=1e-5, rtol=1e-4)
    assert count_hooks(handle.model) == 0


@pytest.mark.parametrize("rows", [[2, 0], [1]])
def test_take_keeps_prompt_order(rows: list[int]) -> None:
    from arithmech.knockout.end_only import EndValues

    values = EndValues([torch.arange(6.0).reshape(3, 2)], [torch.arange(3.0)[:, None]])
    assert values.take(rows).mlp[0][:, 0].tolist() == [float(r) for r in rows]
    assert values.mean().z[0].tolist() == [[2.0, 3.0]] * 3
