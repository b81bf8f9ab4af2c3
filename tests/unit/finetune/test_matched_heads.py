"""Random heads matched to a selection: the same number of heads and key/value groups, hence exactly the trainable
parameters precise SFT's slices count (head_slices.PreciseSlices), on a grouped-query and a multi-head model, at the
real SmolLM2-135M and GPT-2 small shapes (built on the meta device: shapes only, no weights) and on tiny models
with biases; the draw is uniform over all such sets, reproducible, and refuses an impossible match."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from arithmech.errors import ConfigError
from arithmech.finetune.head_slices import PreciseSlices
from arithmech.finetune.matched_heads import kv_groups, matched_random_heads
from arithmech.models.archs import spec_for_model_type
from arithmech.models.sites import Component
from arithmech.models.view import Dims, ModelView

from tiny_models import make_tiny_model


def meta_view(model_type: str) -> ModelView:
    """SmolLM2-135M's attention shape (GQA: 9 query heads, 3 key/value heads, d_head 64) or GPT-2 small's (MHA:
    12 heads of 64), with a tiny vocabulary: only the attention projections' shapes matter here."""
    with torch.device("meta"):
        model: PreTrainedModel = (
            LlamaForCausalLM(LlamaConfig(hidden_size=576, intermediate_size=64, num_hidden_layers=30,
                                         num_attention_heads=9, num_key_value_heads=3, vocab_size=16))
            if model_type == "llama" else
            GPT2LMHeadModel(GPT2Config(n_embd=768, n_layer=12, n_head=12, n_inner=64, vocab_size=16))
        )  # fmt: skip
    return ModelView(model, spec_for_model_type(model_type))


def trained(view: ModelView, heads: list[Component]) -> int:
    return PreciseSlices(view, heads).trainable_parameter_count()


TOP8 = [Component(14, 2), Component(13, 6), Component(14, 6), Component(13, 0), Component(20, 1), Component(14, 8),
        Component(13, 3), Component(19, 5)]  # fmt: skip
"""8 heads in 7 groups of SmolLM2's shape (14.6 and 14.8 share group 2 of layer 14), as its effect-ranked top-8."""


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
@pytest.mark.parametrize("k", [8, 32])
def test_draw_trains_exactly_the_reference_parameters(model_type: str, k: int) -> None:
    view = meta_view(model_type)
    dims = view.dims
    rng = random.Random(f"reference-{k}")
    reference = (
        TOP8
        if k == 8 and model_type == "llama"
        else sorted(
            rng.sample([Component(layer, head) for layer in range(dims.n_layers) for head in range(dims.n_heads)], k)
        )
    )
    groups = len(kv_groups(reference, dims.group_size))
    if model_type == "llama" and k == 8:
        assert groups == 7 and trained(view, reference) == 1_105_920  # (8 heads + 7 groups) x 73,728
    if model_type == "llama" and k == 32:  # the effect-ranked top-32 sit in 22 groups: 3,981,312
        reference = matched_random_heads(dims, 32, 22, rng)
        groups = 22
    for seed in range(3):
        heads = matched_random_heads(dims, k, groups, random.Random(f"arithmetic-sft-{k}-{seed}"))
        assert len(set(heads)) == k and len(kv_groups(heads, dims.group_size)) == groups
        assert trained(view, heads) == trained(view, reference)
    if model_type == "gpt2":  # multi-head attention: every head its own group, so any k heads match
        assert groups == k and trained(view, reference) == k * 4 * 64 * 768 + k * 3 * 64


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gemma3"])
def test_tiny_models_with_biases_and_wide_heads_match_too(arch: str) -> None:
    """Qwen2's q/k/v biases and GPT-2's fused c_attn with biases count per head and per group like the weights;
    Gemma-3's heads are wider than d_model / H."""
    model = make_tiny_model(arch, seed=0)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    dims = view.dims
    reference = [Component(0, 0), Component(0, 1), Component(1, 3)]
    groups = len(kv_groups(reference, dims.group_size))
    for seed in range(5):
        heads = matched_random_heads(dims, 3, groups, random.Random(seed))
        assert trained(view, heads) == trained(view, reference)


def test_draw_is_uniform_over_every_matching_set() -> None:
    """2 layers x 2 groups of 2 heads, 3 heads in 2 groups: all 24 such sets come up equally often."""
    dims = Dims(n_layers=2, n_heads=4, n_kv_heads=2, d_model=8, d_head=2, d_vocab=16)
    every = [Component(layer, head) for layer in range(2) for head in range(4)]
    sets = {tuple(sorted(s)) for s in itertools.combinations(every, 3) if len(kv_groups(s, 2)) == 2}
    assert len(sets) == 24  # C(4, 2) group pairs x 4 ways (2 + 1 or 1 + 2 heads, 2 choices of the single head)
    rng = random.Random(0)
    counts = Counter(tuple(matched_random_heads(dims, 3, 2, rng)) for _ in range(24_000))
    assert set(counts) == sets and all(850 < c < 1150 for c in counts.values())  # 1,000 expected, sd ~31


def test_draw_is_reproducible_and_refuses_an_impossible_match() -> None:
    dims = Dims(n_layers=30, n_heads=9, n_kv_heads=3, d_model=576, d_head=64, d_vocab=49152)
    draw = matched_random_heads(dims, 32, 22, random.Random("s"))
    assert draw == matched_random_heads(dims, 32, 22, random.Random("s"))
    assert draw != matched_random_heads(dims, 32, 22, random.Random("t"))
    assert len(kv_groups(matched_random_heads(dims, 32, 11, random.Random(0)), 3)) == 11  # the fewest: 32 / 3
    with pytest.raises(ConfigError, match="no set of 8 heads touches exactly 2 key/value groups .*between 3 and 8"):
        matched_random_heads(dims, 8, 2, random.Random(0))
    with pytest.raises(ConfigError, match="exactly 9 key/value groups"):
        matched_random_heads(dims, 8, 9, random.Random(0))
