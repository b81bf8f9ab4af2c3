"""Per-head trainable slices: exact start, H/h_l gradient scaling, the GQA policy, optimizer state size.

Gradients are checked against the plain model with its full weight matrices trainable: a delta's gradient must be
that matrix's gradient, restricted to the slice, times H / h_l.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arithmech.finetune.head_slices import PreciseModel, PreciseSlices, SliceDelta
from arithmech.finetune.methods import PreciseTrainable
from arithmech.finetune.optim import AnchoredAdamW
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks
from arithmech.models.sites import Component
from arithmech.models.view import ModelView

from tiny_models import make_tiny_model


def view_of(arch: str) -> ModelView:
    model = make_tiny_model(arch, seed=0)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def toy_batch(seed: int = 1, batch: int = 3, pos: int = 9) -> torch.Tensor:
    return torch.randint(3, 250, (batch, pos), generator=torch.Generator().manual_seed(seed))


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


HEADS = [Component(1, 0), Component(1, 1), Component(0, 3)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gpt-neox", "phi3", "gemma3"])
def test_fresh_wrapper_is_exact_and_leaves_no_hooks(arch: str) -> None:
    view = view_of(arch)
    ids = toy_batch()
    with torch.no_grad():
        before = view.model(input_ids=ids).logits
        wrapped = PreciseModel(view.model, PreciseSlices(view, HEADS, mlp_layers=[1]))
        after = wrapped(input_ids=ids).logits
    assert torch.equal(before, after)
    assert count_hooks(view.model) == 0


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gpt-neox"])
@pytest.mark.parametrize("head_scale", ["gradient", "learning-rate", "none"])
def test_slice_gradient_is_full_gradient_times_h_over_h_l(arch: str, head_scale: str) -> None:
    """Only the gradient form scales gradients; the learning-rate form scales the slices' lr (test_head_scale)."""
    ids = toy_batch()
    plain = view_of(arch)
    loss = lm_loss(plain.model(input_ids=ids).logits, ids)
    loss.backward()
    view = view_of(arch)
    slices = PreciseSlices(view, HEADS, head_scale=head_scale)
    lm_loss(PreciseModel(view.model, slices)(input_ids=ids).logits, ids).backward()
    expected_scale = {1: 4 / 2, 0: 4 / 1} if head_scale == "gradient" else {0: 1.0, 1: 1.0}
    assert all(p.grad is None for p in view.model.parameters())  # no full-matrix gradient is ever formed
    for key, delta in slices.deltas.items():
        assert isinstance(delta, SliceDelta)
        name = slices.target_names[key]
        layer = int(name.split(".")[2])  # model.layers.L..., transformer.h.L..., gpt_neox.layers.L...
        full = plain.model.get_submodule(name)
        want = full.weight.grad.index_select(delta.dim, delta.index) * expected_scale[layer]
        torch.testing.assert_close(delta.weight.grad, want, rtol=1e-5, atol=1e-7)
        if delta.bias is not None:
            want_b = full.bias.grad.index_select(0, delta.index) * expected_scale[layer]
            torch.testing.assert_close(delta.bias.grad, want_b, rtol=1e-5, atol=1e-7)
    summary = slices.summary()
    assert summary["head_scale"] == head_scale and summary["layer_scale"] == {"0": 4.0, "1": 2.0}


def _kv_rows(slices: PreciseSlices, layer: int) -> list[int]:
    key = f"model__layers__{layer}__self_attn__k_proj"
    delta = slices.deltas[key]
    assert isinstance(delta, SliceDelta)
    return delta.index.tolist()


def test_gqa_trains_a_kv_group_iff_one_of_its_heads_is_selected() -> None:
    view = view_of("llama")  # 4 query heads, 2 kv heads: group 0 = heads 0, 1; group 1 = heads 2, 3
    d_head = view.dims.d_head
    same_group = PreciseSlices(view, [Component(0, 0), Component(0, 1)])
    assert _kv_rows(same_group, 0) == list(range(0, d_head))
    assert same_group.kv_groups == {0: {0: [0, 1]}}
    both = PreciseSlices(view, [Component(0, 1), Component(0, 2)])
    assert _kv_rows(both, 0) == list(range(0, 2 * d_head))
    assert both.summary()["kv_groups_trained"] == {"0": {"0": [1], "1": [2]}}
    second = PreciseSlices(view, [Component(0, 3)])
    assert _kv_rows(second, 0) == list(range(d_head, 2 * d_head))
    mqa = view_of("llama-mqa")  # one kv head shared by all four query heads
    only = PreciseSlices(mqa, [Component(1, 2)])
    assert _kv_rows(only, 1) == list(range(0, mqa.dims.d_head))
    assert only.kv_groups == {1: {0: [2]}}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_optimizer_state_is_the_size_of_the_slices(arch: str) -> None:
    view = view_of(arch)
    d = view.dims
    heads = [Component(0, 0), Component(0, 1), Component(1, 2)]  # layer 0: kv group 0; layer 1: kv group 1
    trainable = PreciseTrainable(view, heads, [], head_scale="gradient")
    per_layer = {0: (2, 1), 1: (1, 1)}  # (query heads, kv groups)
    bias = arch == "qwen2"
    expected = sum(
        2 * h * d.d_head * d.d_model + 2 * g * d.d_head * d.d_model + (h + 2 * g) * d.d_head * bias
        for h, g in per_layer.values()
    )
    assert trainable.slices.trainable_parameter_count() == expected
    groups, anchors = trainable.optimizer_groups(0.1)
    opt = AnchoredAdamW(groups, anchors, lr=1e-3)
    ids = toy_batch()
    lm_loss(trainable.module(input_ids=ids).logits, ids).backward()
    opt.step()
    state_numel = sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in opt.state.values())
    assert state_numel == 2 * expected
    model_ids = {id(p) for p in view.model.parameters()}
    assert not model_ids & {id(p) for p in opt.state}
