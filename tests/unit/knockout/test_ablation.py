"""Ablation and batched knockout against plain loops and invariants, on tiny models."""

from __future__ import annotations

import pytest
import torch

from arithmech.knockout.ablation import ablate, ablation_sources, alignment_groups
from arithmech.knockout.batched import knockout_scores
from arithmech.knockout.sweep import k_values, knockout_sweep
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks
from arithmech.models.sites import Component, all_components
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch

from tiny_models import make_tiny_model


def view_of(arch: str) -> ModelView:
    model = make_tiny_model(arch, seed=0)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def make_batch(view: ModelView, lengths: list[int], seed: int = 3) -> PatchingBatch:
    gen = torch.Generator().manual_seed(seed)
    vocab = view.dims.d_vocab
    ref = torch.randint(3, vocab - 2, (len(lengths), max(lengths)), generator=gen)
    cf = ref.clone()
    mask = torch.zeros_like(ref)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        cf[i, n // 2] = (ref[i, n // 2] + 5) % (vocab - 5) + 3
        ref[i, n:] = 0
        cf[i, n:] = 0
    end = torch.tensor(lengths) - 1
    with torch.no_grad():
        logits = view.model(input_ids=ref, attention_mask=mask).logits
    answers = logits[torch.arange(len(lengths)), end].argmax(-1)
    return PatchingBatch(ref, mask, cf, mask.clone(), end, answers)


def end_logits(view: ModelView, batch: PatchingBatch) -> torch.Tensor:
    with torch.no_grad():
        logits = view.model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask, use_cache=False).logits
    return logits[torch.arange(len(batch)), batch.end]


LENGTHS = [6, 6, 8, 8, 6]
KEYS = ["t1", "t1", "t2", "t2", "t1"]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt-neox", "gemma2"])
@pytest.mark.parametrize("mode", ["mean", "zero", "resample"])
def test_empty_knockout_is_bit_identical(arch: str, mode: str) -> None:
    view = view_of(arch)
    batch = make_batch(view, LENGTHS)
    sources = ablation_sources(view, batch, mode, alignment_groups(KEYS, batch.end + 1))
    plain = end_logits(view, batch)
    with ablate(view, [], sources):
        assert count_hooks(view.model) == 0
        knocked = end_logits(view, batch)
    assert torch.equal(plain, knocked)


def test_hooks_removed_when_the_block_raises() -> None:
    view = view_of("llama")
    batch = make_batch(view, LENGTHS)
    sources = ablation_sources(view, batch, "mean", alignment_groups(KEYS, batch.end + 1))
    with pytest.raises(RuntimeError, match="boom"), ablate(view, [Component(1, 0), Component(0)], sources):
        assert count_hooks(view.model) == 2
        raise RuntimeError("boom")
    assert count_hooks(view.model) == 0


@pytest.mark.parametrize("arch", ["llama", "gpt2", "phi3"])
def test_zero_ablation_equals_zeroed_output_weights(arch: str) -> None:
    """Zeroing a head's o_proj input slice = zeroing its W_O block; zeroing an MLP = zeroing its output layer."""
    view = view_of(arch)
    batch = make_batch(view, LENGTHS)
    sources = ablation_sources(view, batch, "zero", alignment_groups(KEYS, batch.end + 1))
    head = Component(1, 1)
    with ablate(view, [head], sources):
        knocked = end_logits(view, batch)
    block = view.head_weight_slices(head.layer, head.head)["o"]
    saved = block.weight().clone()
    with torch.no_grad():
        block.weight().zero_()
    try:
        expected = end_logits(view, batch)
    finally:
        with torch.no_grad():
            block.weight().copy_(saved)
    torch.testing.assert_close(knocked, expected, atol=1e-5, rtol=1e-5)


def test_mean_sources_are_group_means_of_counterfactual_run() -> None:
    view = view_of("llama")
    batch = make_batch(view, LENGTHS)
    groups = alignment_groups(KEYS, batch.end + 1)
    assert groups == [0, 0, 1, 1, 0]
    sources = ablation_sources(view, batch, "mean", groups)
    from arithmech.knockout.ablation import run_activations

    z, mlp = run_activations(view, batch.cf_ids, batch.cf_mask)
    torch.testing.assert_close(sources.z[1][0], z[1][[0, 1, 4]].mean(0))
    torch.testing.assert_close(sources.mlp[0][2], mlp[0][[2, 3]].mean(0))
    end_only = ablation_sources(view, batch, "mean", groups, end_only=True)
    rows = torch.arange(len(batch))
    assert end_only.positions.sum() == len(batch)
    torch.testing.assert_close(end_only.z[0][rows, batch.end], z[0][rows, batch.end].mean(0).expand(len(batch), -1))


def test_resample_takes_another_prompt_of_the_group() -> None:
    view = view_of("llama")
    batch = make_batch(view, LENGTHS)
    groups = alignment_groups(KEYS, batch.end + 1)
    sources = ablation_sources(view, batch, "resample", groups, seed=1)
    from arithmech.knockout.ablation import run_activations

    z, _ = run_activations(view, batch.ref_ids, batch.ref_mask)
    for i in range(len(batch)):
        matches = [j for j in range(len(batch)) if torch.equal(sources.z[0][i], z[0][j])]
        assert matches and matches[0] != i and groups[matches[0]] == groups[i]


@pytest.mark.parametrize("mode", ["mean", "resample"])
def test_batched_scores_equal_one_configuration_per_pass(mode: str) -> None:
    view = view_of("llama")
    batch = make_batch(view, LENGTHS)
    sources = ablation_sources(view, batch, mode, alignment_groups(KEYS, batch.end + 1))
    configs = [
        [],
        [Component(0, 1)],
        [Component(2, 3), Component(1)],
        [Component(1, 0), Component(1, 2), Component(0)],
    ]
    scores = knockout_scores(view, batch, sources, configs, batch_size=7)
    for i, config in enumerate(configs):
        with ablate(view, config, sources):
            logits = end_logits(view, batch)
        assert torch.equal(scores.correct[i], logits.argmax(-1) == batch.answer_ids)
        torch.testing.assert_close(
            scores.answer_prob[i], logits.softmax(-1)[torch.arange(len(batch)), batch.answer_ids]
        )
    assert scores.accuracy[0] == 1.0  # answers are the model's own top tokens


def test_sweep_rows_and_errors() -> None:
    view = view_of("llama")
    batch = make_batch(view, LENGTHS)
    sources = ablation_sources(view, batch, "mean", alignment_groups(KEYS, batch.end + 1))
    heads = [c for c in all_components(view.dims) if c.head is not None]
    rows = knockout_sweep(view, batch, sources, heads[::-1], heads, max_k=5, n_random=2)
    assert k_values(5) == [1, 2, 4, 5]
    assert len(rows) == 1 + 4 * 3
    effect = [r for r in rows if r.ranking == "effect"]
    assert [r.components for r in effect][1] == (heads[-1].name, heads[-2].name)
    again = knockout_sweep(view, batch, sources, heads[::-1], heads, max_k=5, n_random=2)
    assert rows == again  # same seed, same draws and numbers
    from arithmech.errors import ConfigError

    with pytest.raises(ConfigError, match="larger than"):
        knockout_sweep(view, batch, sources, heads, heads, max_k=len(heads) + 1)
