"""Ablation and batched knockout against plain loops and invariants, on tiny models."""

from __future__ import annotations

import pytest
import torch

from arithmech.errors import ConfigError
from arithmech.knockout.ablation import AblationSources, ablate, ablation_sources, alignment_groups, run_activations
from arithmech.knockout.batched import knockout_scores
from arithmech.knockout.configurations import k_values
from arithmech.knockout.sweep import knockout_sweep
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks
from arithmech.models.sites import Component, all_components
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch

from forward_cost import count_layer_tokens
from tiny_models import TINY_ARCHS, make_tiny_model


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
    assert groups == ["t1@6", "t1@6", "t2@8", "t2@8", "t1@6"]
    sources = ablation_sources(view, batch, "mean", groups, min_group_size=2)
    z, mlp = run_activations(view, batch.cf_ids, batch.cf_mask)
    torch.testing.assert_close(sources.z[1][sources.row[0]], z[1][[0, 1, 4]].mean(0))
    torch.testing.assert_close(sources.mlp[0][sources.row[2]], mlp[0][[2, 3]].mean(0))
    assert torch.equal(sources.positions, batch.ref_mask.bool())
    assert sources.info["groups"] == {"t1@6": 3, "t2@8": 2} and sources.info["end_fallback_prompts"] == 0
    end_only = ablation_sources(view, batch, "mean", groups, end_only=True)
    rows = torch.arange(len(batch))
    assert end_only.positions.sum() == len(batch) and end_only.positions[rows, batch.end].all()
    at_end = end_only.z[0][end_only.row, batch.end]  # [prompt, H*dh]
    torch.testing.assert_close(at_end, z[0][rows, batch.end].mean(0).expand(len(batch), -1))


def test_small_groups_fall_back_to_the_end_mean_of_the_whole_set() -> None:
    """A group below min_group_size would mostly put back the prompt's own counterfactual (a group of one:
    exactly it), so its prompts are ablated at END only, with the END mean over every counterfactual prompt."""
    view = view_of("llama")
    batch = make_batch(view, LENGTHS)
    groups = alignment_groups(KEYS, batch.end + 1)  # t1: 3 prompts, t2: 2 prompts
    sources = ablation_sources(view, batch, "mean", groups, min_group_size=3)
    z, _ = run_activations(view, batch.cf_ids, batch.cf_mask)
    rows = torch.arange(len(batch))
    end_mean = z[2][rows, batch.end].mean(0)
    for i in (2, 3):  # the t2 group is too small
        assert sources.positions[i].sum() == 1 and sources.positions[i, batch.end[i]]
        torch.testing.assert_close(sources.z[2][sources.row[i], batch.end[i]], end_mean)
    for i in (0, 1, 4):  # t1 keeps its per-position group mean
        assert torch.equal(sources.positions[i], batch.ref_mask[i].bool())
        torch.testing.assert_close(sources.z[2][sources.row[i]], z[2][[0, 1, 4]].mean(0))
    assert sources.info["end_fallback_prompts"] == 2 and sources.info["min_group_size"] == 3
    alone = alignment_groups(["a", "b", "c", "d", "e"], batch.end + 1)  # every prompt alone in its group
    lonely = ablation_sources(view, batch, "mean", alone)
    assert lonely.positions.sum() == len(batch)  # no prompt gets its own counterfactual back
    for i in range(len(batch)):
        assert not torch.allclose(lonely.z[2][lonely.row[i], batch.end[i]], z[2][i, batch.end[i]])
    with pytest.raises(ConfigError, match="at least 4 prompts"):
        ablation_sources(view, batch.select(slice(0, 3)), "mean", groups[:3])
    with pytest.raises(ConfigError, match="min_group_size must be at least 2"):
        ablation_sources(view, batch, "mean", groups, min_group_size=1)


def resampled(min_group_size: int) -> tuple[PatchingBatch, list[str], AblationSources, list[torch.Tensor]]:
    """The test batch, its groups, resample sources (seed 1) and the reference run's o_proj inputs."""
    view = view_of("llama")
    batch = make_batch(view, LENGTHS)
    groups = alignment_groups(KEYS, batch.end + 1)
    sources = ablation_sources(view, batch, "resample", groups, seed=1, min_group_size=min_group_size)
    return batch, groups, sources, run_activations(view, batch.ref_ids, batch.ref_mask)[0]


def test_resample_takes_another_prompt_of_the_group() -> None:
    batch, groups, sources, z = resampled(min_group_size=2)
    for i in range(len(batch)):
        matches = [j for j in range(len(batch)) if torch.equal(sources.z[0][sources.row[i]], z[0][j])]
        assert matches and matches[0] != i and groups[matches[0]] == groups[i]


def test_resample_of_a_small_group_takes_another_prompts_end_value() -> None:
    batch, _, sources, z = resampled(min_group_size=3)
    for i in (2, 3):
        assert sources.positions[i].sum() == 1 and sources.positions[i, batch.end[i]]
        value = sources.z[1][sources.row[i], batch.end[i]]
        donors = [j for j in range(len(batch)) if torch.equal(value, z[1][j, batch.end[j]])]
        assert donors and i not in donors
    assert torch.equal(sources.positions[[0, 1, 4]], batch.ref_mask[[0, 1, 4]].bool())
    taken = sources.take([4, 2])
    assert torch.equal(taken.row, sources.row[[4, 2]]) and torch.equal(taken.positions, sources.positions[[4, 2]])


@pytest.mark.parametrize("mode", ["mean", "resample"])
@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_batched_scores_equal_one_configuration_per_pass(arch: str, mode: str) -> None:
    view = view_of(arch)
    batch = make_batch(view, LENGTHS)
    sources = ablation_sources(view, batch, mode, alignment_groups(KEYS, batch.end + 1))
    configs = [
        [],
        [Component(0, 1)],
        [Component(2, 3), Component(1)],
        [Component(1, 0), Component(1, 2), Component(0)],
    ]
    configs = [[c for c in config if c.layer < view.dims.n_layers] for config in configs]  # 2-layer archs
    scores = knockout_scores(view, batch, sources, configs, batch_size=7)
    for i, config in enumerate(configs):
        with ablate(view, config, sources):
            logits = end_logits(view, batch)
        assert torch.equal(scores.correct[i], logits.argmax(-1) == batch.answer_ids)
        torch.testing.assert_close(
            scores.answer_prob[i], logits.softmax(-1)[torch.arange(len(batch)), batch.answer_ids]
        )
    assert scores.accuracy[0] == 1.0  # answers are the model's own top tokens
    assert count_hooks(view.model) == 0


def test_rows_start_at_the_lowest_ablated_layer() -> None:
    """Layer m runs the intact pass of the prompts, then the rows of each configuration ablating a layer <= m."""
    view = view_of("llama")  # 3 layers
    batch = make_batch(view, LENGTHS)
    sources = ablation_sources(view, batch, "zero", [0] * len(batch))
    configs = [[], [Component(2, 1)], [Component(1)], [Component(2), Component(0, 3)]]  # first layers 3, 2, 1, 0
    with count_layer_tokens(view) as seen:
        knockout_scores(view, batch, sources, configs, batch_size=100)
    tokens = len(batch) * max(LENGTHS)  # every pass holds all prompts, padded to the longest
    assert seen == [2 * tokens, 3 * tokens, 4 * tokens]  # intact pass + configurations with first layer <= m


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
    with pytest.raises(ConfigError, match="larger than"):
        knockout_sweep(view, batch, sources, heads, heads, max_k=len(heads) + 1)
