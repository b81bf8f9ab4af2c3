"""The cost of the path-patching scans, counted in forward passes (tests/forward_cost.py: of the prompts, each at its
own length with its last token's logits, the docs' unit; and of the right-padded batch).

Counted on a random-init model with SmolLM2-135M's shape scaled down (30 layers x 9 heads, 3 key/value heads,
d_mlp / d_model = 8 / 3, d_vocab / d_model = 49152 / 576): linear-layer work scales as d_model^2 throughout,
so the count in forward passes is SmolLM2's own, on any machine. The prompts look like the benchmark's: about
30 tokens, the pair differing only at the query's operator, four tokens before END (few-shot examples shared).
The cost model of docs/performance.md is the formula checked here.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch, length_chunks, path_patch
from arithmech.patching.scan_cost import layer_macs, prompt_pass_macs, scan_macs

from forward_cost import count_work, plain_forward_macs, prompt_forward_macs
from tiny_models import seeded_rng

LENGTHS = [28, 30, 32, 30, 29, 31, 30, 30]
OPERATOR_FROM_END = 4


def smollm2_shaped() -> ModelView:
    config = LlamaConfig(
        hidden_size=36, intermediate_size=96, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        vocab_size=3072, tie_word_embeddings=True, max_position_embeddings=64, attn_implementation="eager",
        use_cache=False,
    )  # fmt: skip
    with seeded_rng(0):
        model = AutoModelForCausalLM.from_config(config).eval()
    return ModelView(model, spec_for_model_type("llama"))


def benchmark_like_batch(vocab: int) -> PatchingBatch:
    gen = torch.Generator().manual_seed(0)
    ref = torch.randint(3, vocab, (len(LENGTHS), max(LENGTHS)), generator=gen)
    cf, mask = ref.clone(), torch.zeros_like(ref)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
        cf[i, n - OPERATOR_FROM_END] = (ref[i, n - OPERATOR_FROM_END] + 1) % vocab
    end = torch.tensor(LENGTHS) - 1
    return PatchingBatch(ref, mask, cf, mask.clone(), end, torch.randint(3, vocab, (len(LENGTHS),), generator=gen))


def predicted_passes(
    view: ModelView, batch: PatchingBatch, variant: str, batch_size: int, unit: str = "padded"
) -> float:
    """The cost model of docs/performance.md (patching/scan_cost.py), in multiply-accumulates of a llama-family
    model, over one forward pass in `unit`: "prompts", each prompt at its own length with the logits of its last
    token (the docs' unit, `prompt_forward_macs`), or "padded", the right-padded batch with the logits of every
    position (`plain_forward_macs`).

    Both variants, per chunk of the engine (`length_chunks`): the reference pass (n x W tokens through L layers,
    W the chunk's longest prompt) and the counterfactual pass of the positions after the chunk's shared start s
    (n x (W - s)). path: per prompt, an MLP on every (sender so far, layer): (H + 1) L (L - 1) / 2 + H L MLP
    applications. total: per prompt, one token through the layers above each sender, (H + 1) L (L - 1) / 2
    token-layers, plus the head senders' own-layer MLP, H L.
    """
    d = view.dims
    c_attn, c_mlp = layer_macs(d.d_model, d.n_heads, d.n_kv_heads, d.d_head, view.mlp(0).up_proj.out_features)
    if unit == "prompts":
        tokens = int(batch.ref_mask.sum())
        plain = prompt_pass_macs(tokens, len(batch), d.n_layers, c_attn + c_mlp, d.d_vocab, d.d_model)
    else:
        plain = len(batch) * batch.ref_ids.shape[1] * (d.n_layers * (c_attn + c_mlp) + d.d_vocab * d.d_model)
    chunks = []
    for prompts in length_chunks(batch, batch_size):
        chunk = batch.select(prompts)
        chunks.append((len(chunk), int(chunk.ref_ids.shape[1]), chunk.shared_length()))
    return scan_macs(variant, d.n_layers, d.n_heads, c_attn, c_mlp, chunks) / plain


@pytest.mark.parametrize(("variant", "limit"), [("path", 5.5), ("total", 6.5)])
def test_scan_costs_what_the_cost_model_says(variant: str, limit: float) -> None:
    """In both units; the limit in the docs' (about 30 tokens a prompt: the per-sender work weighs more than at
    the default set's 45)."""
    view = smollm2_shaped()
    batch = benchmark_like_batch(view.dims.d_vocab)
    with count_work(view.model) as work:
        path_patch(view, batch, variant, batch_size=len(batch))
    padded = work.macs / plain_forward_macs(view.model, batch.ref_ids, batch.ref_mask)
    assert padded == pytest.approx(predicted_passes(view, batch, variant, len(batch)), rel=0.01)
    passes = work.macs / prompt_forward_macs(view.model, batch.ref_ids, batch.ref_mask)
    assert passes == pytest.approx(predicted_passes(view, batch, variant, len(batch), unit="prompts"), rel=0.01)
    assert passes <= limit, f"{variant} patching costs {passes:.2f} forward passes of the prompts (limit {limit})"
    assert count_hooks(view.model) == 0


def test_prompts_of_many_lengths_cost_what_unpadded_prompts_would() -> None:
    """Prompts of 22 to 58 tokens in one batch (the default reference set has 26 to 70): the engine's chunks of
    about one length cost within 10% of the cost model on every prompt at its own length and shared start; one
    chunk padded to the longest prompt cost 36% more here (before issue #22)."""
    view = smollm2_shaped()
    lengths = [22, 26, 30, 38, 42, 50, 54, 58] * 2
    gen = torch.Generator().manual_seed(0)
    vocab = view.dims.d_vocab
    ref = torch.randint(3, vocab, (len(lengths), max(lengths)), generator=gen)
    cf, mask = ref.clone(), torch.zeros_like(ref)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        cf[i, n - 7] = (ref[i, n - 7] + 1) % vocab  # the operator, 7 tokens before the end (T - s = 6.75 there)
    batch = PatchingBatch(ref, mask, cf, mask.clone(), torch.tensor(lengths) - 1, torch.randint(3, vocab, (16,)))
    unit = prompt_forward_macs(view.model, ref, mask)  # every prompt at its own length, its last token's logits
    with count_work(view.model) as work:
        path_patch(view, batch, "total", batch_size=len(batch))
    passes = work.macs / unit
    assert passes == pytest.approx(predicted_passes(view, batch, "total", len(batch), unit="prompts"), rel=0.01)
    one_prompt_chunks = predicted_passes(view, batch, "total", 1, unit="prompts")  # no padding, each its own s
    assert passes <= 1.10 * one_prompt_chunks, f"{passes:.2f} passes against {one_prompt_chunks:.2f} unpadded"
