"""Comparative neuron analysis (arithmech.neurons) against plain direct computations on tiny random models.

The references here read activations with hand-registered hooks, build x + v explicitly, apply the final norm
by its textbook formula with the original run's scale, unembed and take log_softmax; zeroing a head is done by
zeroing its W_O block in a copy of the model. Models run in float64 so that 1e-5 is a meaningful tolerance.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from arithmech.data import OPERATIONS
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.errors import ConfigError, DataError
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks, hooks
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.neurons import (
    HeadImportance,
    attention_li,
    cna_scores,
    comparative_neurons,
    end_coefficients,
    end_states,
    head_importance,
    mask_neurons,
    neuron_li,
    neuron_li_from_states,
    operation_sets,
    predictions,
    run_scales,
    specialised_heads,
    top_neurons_report,
    value_vectors,
)
from arithmech.patching.path import PatchingBatch

from tiny_models import make_tiny_model, make_tiny_tokenizer

TOL = {"atol": 1e-5, "rtol": 1e-5}
LENGTHS = [6, 8, 5]


def view_of(arch: str, dtype: torch.dtype = torch.float64) -> ModelView:
    model = make_tiny_model(arch, seed=0).to(dtype)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def make_batch(view: ModelView, lengths: list[int] = LENGTHS, seed: int = 3) -> PatchingBatch:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, view.dims.d_vocab - 2, (len(lengths), max(lengths)), generator=gen)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = 0
    end = torch.tensor(lengths) - 1
    return PatchingBatch(ids, mask, ids, mask, end, plain_end_logits(view.model, ids, mask, end).argmax(-1))


# -- plain references -----------------------------------------------------------------------------------
def plain_end_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return logits[torch.arange(len(end)), end]  # [row, d_vocab]


def read_at_end(model: Any, batch: PatchingBatch, sites: list[tuple[nn.Module, bool]]) -> list[torch.Tensor]:
    """END rows of each (module, is_input) site, read by hand-registered hooks in one plain forward pass."""
    got: list[Any] = [None] * len(sites)
    rows = torch.arange(len(batch))
    handles = []
    for i, (module, is_input) in enumerate(sites):
        if is_input:
            fn = lambda _m, args, i=i: got.__setitem__(i, args[0][rows, batch.end].clone())  # noqa: E731
            handles.append(module.register_forward_pre_hook(fn))
        else:
            fn = lambda _m, _a, out, i=i: got.__setitem__(  # noqa: E731
                i, (out[0] if isinstance(out, tuple) else out)[rows, batch.end].clone()
            )
            handles.append(module.register_forward_hook(fn))
    try:
        with torch.no_grad():
            model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return got


def textbook_norm(arch: str, module: nn.Module, y: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """The norm of y with the scale of x0 held fixed, written out per family."""
    if isinstance(module, nn.LayerNorm):
        s = (x0.var(-1, unbiased=False, keepdim=True) + module.eps).sqrt()
        return module.weight * (y - y.mean(-1, keepdim=True)) / s + module.bias
    eps = getattr(module, "eps", None) or module.variance_epsilon
    gain = 1 + module.weight if arch.startswith("gemma") else module.weight
    return gain * y / (x0.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def textbook_log_probs(view: ModelView, arch: str, y: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    logits = view.model.lm_head(textbook_norm(arch, view.final_norm, y, final))
    cap = getattr(view.model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits.log_softmax(-1)


def direct_neuron_li(
    view: ModelView, arch: str, model: Any, batch: PatchingBatch, layer: int, w: torch.Tensor, ref: Any = None
) -> torch.Tensor:
    """[row, d_mlp] by building x + m_k W_down[:, k] one neuron at a time; scales from `ref` (default: model)."""
    block = model.get_submodule(view.spec.layers)[layer]
    mlp = block.get_submodule(view.spec.mlp)
    down = mlp.get_submodule("c_proj" if arch == "gpt2" else "down_proj")
    x, m, out = read_at_end(model, batch, [(block.get_submodule(view.spec.mlp_norm), True), (down, True), (mlp, False)])
    ref = model if ref is None else ref
    ref_block = ref.get_submodule(view.spec.layers)[layer]
    final, ref_out = read_at_end(ref, batch, [(view.final_norm, True), (ref_block.get_submodule(view.spec.mlp), False)])
    li = torch.empty(m.shape, dtype=torch.float64)
    with torch.no_grad():
        for r in range(len(batch)):
            base = textbook_log_probs(view, arch, x[r], final[r])[w[r]]
            for k in range(m.shape[1]):
                column = down.weight[k] if arch == "gpt2" else down.weight[:, k]  # Conv1D is (in, out)
                v = m[r, k] * column
                if view.spec.mlp_out_norm:  # Gemma: the post-MLP norm with the MLP output's scale fixed
                    post = block.get_submodule(view.spec.mlp_out_norm)
                    v = (1 + post.weight) * v / (ref_out[r].pow(2).mean() + post.eps).sqrt()
                li[r, k] = textbook_log_probs(view, arch, x[r] + v, final[r])[w[r]] - base
    return li


# -- log-probability increase ---------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
def test_neuron_li_matches_direct_computation(arch: str) -> None:
    view = view_of(arch)
    batch = make_batch(view)
    layers = list(range(view.dims.n_layers))
    li = neuron_li(view, batch, layers, max_elements=3 * 258 * 40)  # chunks of 40 neurons
    assert count_hooks(view.model) == 0
    top = plain_end_logits(view.model, batch.ref_ids, batch.ref_mask, batch.end).argmax(-1)
    for i, layer in enumerate(layers):
        torch.testing.assert_close(li[:, i], direct_neuron_li(view, arch, view.model, batch, layer, top), **TOL)
    assert li.abs().max() > 1e-3  # not trivially zero
    other = torch.tensor([48, 49, 50])
    torch.testing.assert_close(
        neuron_li(view, batch, [0], target=other)[:, 0], direct_neuron_li(view, arch, view.model, batch, 0, other)
    )


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
def test_attention_li_matches_direct_computation(arch: str) -> None:
    view = view_of(arch)
    batch = make_batch(view)
    layers = list(range(view.dims.n_layers))
    blocks = view.model.get_submodule(view.spec.layers)
    sites = [(view.final_norm, True)]
    for layer in layers:  # sequential blocks: the attention adds (MLP-read residual - block input)
        sites += [(blocks[layer].get_submodule(view.spec.attn_norm), True), (view.mlp_norm(layer), True)]
    final, *reads = read_at_end(view.model, batch, sites)
    top = plain_end_logits(view.model, batch.ref_ids, batch.ref_mask, batch.end).argmax(-1)
    rows = torch.arange(len(batch))
    expected = torch.empty(len(batch), len(layers), dtype=torch.float64)
    with torch.no_grad():
        for i in range(len(layers)):
            x, after = reads[2 * i], reads[2 * i + 1]
            with_v = textbook_log_probs(view, arch, after, final)[rows, top]
            expected[:, i] = with_v - textbook_log_probs(view, arch, x, final)[rows, top]
    torch.testing.assert_close(attention_li(view, batch, layers), expected, **TOL)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt-neox"])
def test_neuron_li_of_a_bfloat16_model_is_read_out_in_float32(arch: str) -> None:
    """LI of a bfloat16 model (its norms read in float32, also nn.LayerNorm, which refuses mixed dtypes) equals
    the LI of the same weights in float32 up to the bfloat16 forward pass: |difference| <= 0.05, measured <= 0.02
    where the largest |LI| is ~1."""
    float32 = view_of(arch, torch.float32)
    for p in float32.model.parameters():
        p.data = p.data.to(torch.bfloat16).float()  # the same bfloat16-rounded weights in both
    bf16 = view_of(arch, torch.bfloat16)
    batch = make_batch(float32)
    want = neuron_li(float32, batch, [0, 1], target=batch.answer_ids)
    got = neuron_li(bf16, batch, [0, 1], target=batch.answer_ids)
    assert got.dtype == torch.float32 and float(want.abs().max()) > 0.1
    torch.testing.assert_close(got, want, atol=0.05, rtol=0)


def test_li_rejects_bad_input() -> None:
    view = view_of("llama")
    batch = make_batch(view)
    with pytest.raises(ConfigError, match="layers"):
        neuron_li(view, batch, [7])
    with pytest.raises(ConfigError, match="target"):
        neuron_li(view, batch, [0], target=torch.tensor([1, 2]))


# -- coefficients, value vectors, masking ---------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_coefficients_and_value_vectors_rebuild_the_mlp_output(arch: str) -> None:
    view = view_of(arch)
    batch = make_batch(view)
    layers = list(range(view.dims.n_layers))
    coeff = end_coefficients(view, batch.ref_ids, batch.ref_mask, batch.end, layers)
    assert coeff.shape == (len(batch), len(layers), 128)
    for i, layer in enumerate(layers):
        m, out = read_at_end(view.model, batch, [(view.down_proj(layer), True), (view.mlp(layer), False)])
        torch.testing.assert_close(coeff[:, i], m.float(), rtol=0, atol=0)  # the same numbers, read by hand
        bias = getattr(view.down_proj(layer), "bias", None)
        rebuilt = m @ value_vectors(view, layer) + (0 if bias is None else bias)  # sum_k m_k W_down[:, k] + b
        torch.testing.assert_close(rebuilt, out, **TOL)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
def test_mask_neurons(arch: str) -> None:
    view = view_of(arch)
    batch = make_batch(view)
    plain = plain_end_logits(view.model, batch.ref_ids, batch.ref_mask, batch.end)
    with mask_neurons(view, {}):
        assert count_hooks(view.model) == 0
    with mask_neurons(view, {0: torch.arange(128), 1: list(range(128))}):
        assert torch.equal(plain_end_logits(view.model, batch.ref_ids, batch.ref_mask, batch.end), plain)
    kept = torch.tensor([3, 17, 90])
    with mask_neurons(view, {1: kept}):
        masked = plain_end_logits(view.model, batch.ref_ids, batch.ref_mask, batch.end)
    assert count_hooks(view.model) == 0
    model = copy.deepcopy(view.model)  # the same masking by zeroing the other neurons' value vectors
    with torch.no_grad():
        rows = torch.ones(128, dtype=torch.bool)
        rows[kept] = False
        value_vectors(ModelView(model, view.spec), 1)[rows] = 0.0
    torch.testing.assert_close(masked, plain_end_logits(model, batch.ref_ids, batch.ref_mask, batch.end), **TOL)
    with pytest.raises(ConfigError, match="0..127"):
        with mask_neurons(view, {0: [128]}):
            pass


# -- comparative neuron analysis ------------------------------------------------------------------------
def zero_head(view: ModelView, head: Component) -> Any:
    """A copy of the model with the head's W_O block set to zero."""
    model = copy.deepcopy(view.model)
    with torch.no_grad():
        ModelView(model, view.spec).head_weight_slices(head.layer, head.head)["o"].weight().zero_()
    return model


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_cna_equals_li_of_a_model_with_the_head_zeroed(arch: str) -> None:
    view = view_of(arch)
    batch = make_batch(view)
    head = Component(0, 1)
    result = comparative_neurons(view, batch, head, [0, 1])
    assert count_hooks(view.model) == 0
    top = plain_end_logits(view.model, batch.ref_ids, batch.ref_mask, batch.end).argmax(-1)
    assert torch.equal(result.target, top)
    zeroed = zero_head(view, head)
    for i, layer in enumerate([0, 1]):
        intact = direct_neuron_li(view, arch, view.model, batch, layer, top)
        without = direct_neuron_li(view, arch, zeroed, batch, layer, top, ref=view.model)  # intact scales
        torch.testing.assert_close(result.li_intact[:, i], intact, **TOL)
        torch.testing.assert_close(result.li_zeroed[:, i], without, **TOL)
        torch.testing.assert_close(result.scores[:, i], intact - without, **TOL)
    m_zeroed = read_at_end(zeroed, batch, [(ModelView(zeroed, view.spec).down_proj(1), True)])[0]
    torch.testing.assert_close(result.coeff_zeroed[:, 1], m_zeroed.float(), **TOL)
    assert result.scores[:, 1].abs().max() > 1e-4  # the head matters to layer 1's neurons


def test_cna_is_exactly_zero_for_a_head_that_writes_nothing() -> None:
    view = view_of("llama")
    head = Component(0, 2)
    view = ModelView(zero_head(view, head), view.spec)  # the head's output is already zero
    batch = make_batch(view)
    scores = cna_scores(view, batch, head, [0, 1, 2])
    assert torch.equal(scores, torch.zeros_like(scores))
    assert neuron_li(view, batch, [1]).abs().max() > 1e-3  # while the LIs themselves are not zero


def test_top_neurons_report() -> None:
    view = view_of("llama")
    batch = make_batch(view)
    result = comparative_neurons(view, batch, Component(1, 0), [1, 2])
    report = top_neurons_report(view, make_tiny_tokenizer(), result, k=5, n_tokens=10)
    assert [(r.layer, r.neuron) for r in report] == result.top(5)
    scores = result.scores.mean(0)
    assert [r.cna for r in report] == sorted((r.cna for r in report), reverse=True)
    assert report[0].cna == pytest.approx(float(scores.max()))
    first = report[0]
    i = result.layers.index(first.layer)
    assert first.coeff_intact == pytest.approx(float(result.coeff_intact[:, i, first.neuron].mean()))
    assert first.li_zeroed == pytest.approx(float(result.li_zeroed[:, i, first.neuron].mean()))
    direction = view.final_norm.weight * view.down_proj(first.layer).weight[:, first.neuron]
    expected = (view.model.lm_head.weight @ direction).topk(10).indices
    tok = make_tiny_tokenizer()
    assert first.top_tokens == [tok.decode([int(t)]) for t in expected]
    flipped = first.promoted_tokens != first.top_tokens
    assert flipped == (first.coeff_intact < 0)


# -- head importance ------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_head_importance_equals_zeroing_w_o(arch: str) -> None:
    view = view_of(arch)
    sets = {"addition": make_batch(view, [6, 8, 5]), "division": make_batch(view, [7, 7], seed=5)}
    heads = [Component(0, 1), Component(1, 3)]
    result = head_importance(view, sets, components=heads, batch_size=4)
    assert count_hooks(view.model) == 0
    for i, batch in enumerate(sets.values()):
        rows = torch.arange(len(batch))
        plain = plain_end_logits(view.model, batch.ref_ids, batch.ref_mask, batch.end)
        top = plain.argmax(-1)
        p0 = plain.softmax(-1)[rows, top]
        torch.testing.assert_close(result.base_prob[i], p0.mean().float(), **TOL)
        for j, head in enumerate(heads):
            zeroed = plain_end_logits(zero_head(view, head), batch.ref_ids, batch.ref_mask, batch.end)
            drop = (p0 - zeroed.softmax(-1)[rows, top]).mean()
            torch.testing.assert_close(result.prob_drop[i, j], drop.float(), **TOL)
            kept = (zeroed.argmax(-1) == top).float().mean()
            assert float(result.accuracy_drop[i, j]) == pytest.approx(1.0 - float(kept))
    assert result.prob_drop.abs().max() > 1e-4


def test_specialised_heads() -> None:
    heads = [Component(0, h) for h in range(4)] + [Component(0)]
    drops = torch.tensor([[0.5, 0.3, 0.0, -0.1, 9.0], [0.4, 0.0, 0.2, 0.1, 9.0]])  # MLP column is ignored
    result = HeadImportance(("addition", "division"), heads, drops, drops, torch.ones(2), torch.ones(2), {})
    spec = specialised_heads(result, top=2)
    assert spec.top == {"addition": [heads[0], heads[1]], "division": [heads[0], heads[2]]}
    assert spec.share["addition"] == pytest.approx(1.0)
    assert spec.share["division"] == pytest.approx(0.6 / 0.7)
    assert spec.only == {"addition": [heads[1]], "division": [heads[2]]}
    assert spec.shared == [heads[0]]
    with pytest.raises(ConfigError, match="top"):
        specialised_heads(result, top=5)


def test_operation_sets() -> None:
    view = view_of("llama", torch.float32)
    handle = ModelHandle(view.model, make_tiny_tokenizer(), view)
    cfg = ReferenceSetConfig(
        formations=("equation",), n_per_template=2, few_shot=1, max_prompts=4, filter_correct=False
    )
    sets, counts = operation_sets(handle, cfg)
    assert tuple(sets) == OPERATIONS
    for op, batch in sets.items():
        assert 0 < len(batch) <= 4 and counts[op]["used"] == len(batch)
    with pytest.raises(DataError, match="no prompt"):  # a random model answers nothing
        operation_sets(handle, ReferenceSetConfig(formations=("equation",), n_per_template=1, few_shot=0))


def test_end_states_share_the_forward_pass_with_active_hooks() -> None:
    """States read under another hook see the hooked run (what comparative_neurons relies on)."""
    view = view_of("llama")
    batch = make_batch(view)
    zero_mlp0 = [(view.mlp(0), lambda _m, _a, out: torch.zeros_like(out))]
    with hooks(post=zero_mlp0):
        states = end_states(view, batch, [1])
    m = read_at_end(view.model, batch, [(view.down_proj(1), True)])[0]
    assert not torch.allclose(states.coeff[:, 0], m)
    li = neuron_li_from_states(view, states, predictions(view, states), run_scales(view, states))
    assert li.shape == (len(batch), 1, 128)
