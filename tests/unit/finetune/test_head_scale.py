"""H / h_l under AdamW and SGD: on the gradient it changes AdamW's steps only through eps; on the lr it acts.

Adam's update m_hat / (sqrt(v_hat) + eps) of a gradient c * g is m_hat / (sqrt(v_hat) + eps / c): the paper's
gradient scaling is the unscaled run with eps / c. Decoupled weight decay (AnchoredAdamW: lr * wd * (W0 + Delta))
reads no gradient, so it is the same in both runs. Hence (float64 llama, 3 steps of warm-up and decay, wd 0.1,
no clipping):
    gradient form == no scaling with eps / (H / h_l) per layer        exactly (measured difference 0.0)
    gradient form vs no scaling                                       <= 1e-4 x the largest step (measured
        3.7e-5): each entry's update changes by the factor (sqrt(v_hat) + eps) / (sqrt(v_hat) + eps / c),
        relatively by less than eps / sqrt(v_hat), with eps = 1e-8 and sqrt(v_hat) >= ~1e-6 here
    SGD, one step (after the warm-up's lr-0 step): gradient form == H / h_l x no scaling, per layer, to 1e-12
Gradient clipping by the global norm (train.py, max_grad_norm) is left out here: the scaled gradients raise
that norm, so with clipping active the scale changes how much each step is clipped, which Adam divides out only
as far as that change is the same at every step (on a tiny llama clipped at every step: weights 1.1e-5 apart,
6e-6 without clipping, 1.3e-2 for the learning-rate form). The learning-rate form is the meaningful one under
Adam: it equals setting each layer's slice groups' lr to lr * H / h_l by hand, through warm-up and decay.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_optim import batches, lm_loss, view_of

from arithmech.finetune.methods import PreciseTrainable
from arithmech.finetune.optim import AnchoredAdamW, build_scheduler, with_group_lrs
from arithmech.models.sites import Component

LR, WD, EPS, STEPS = 1e-2, 0.1, 1e-8, 3
HEADS = [Component(0, 1), Component(1, 0), Component(1, 3)]
SCALE = {0: 4.0, 1: 2.0}
"""H / h_l: 4 heads per layer, 1 selected in layer 0 and 2 in layer 1."""


def layer_of(group: dict[str, Any]) -> int | None:
    """The layer of a head-slice group ("head_slices.3", "head_slice_biases.3"), None for the MLPs' groups."""
    name = str(group.get("name", ""))
    return int(name.rsplit(".", 1)[1]) if name.startswith("head_slice") else None


def train_deltas(
    head_scale: str, optimizer: str = "adamw", eps_by_layer: dict[int, float] | None = None,
    lr_by_layer: dict[int, float] | None = None, steps: int = STEPS,
) -> dict[str, torch.Tensor]:
    """Train the slices of HEADS (float64 llama) and return each trained delta by name."""
    trainable = PreciseTrainable(view_of("llama"), HEADS, [], head_scale)
    groups, anchors = trainable.optimizer_groups(WD if optimizer == "adamw" else 0.0)
    groups = with_group_lrs(groups, LR)
    for g in groups:
        layer = layer_of(g)
        if layer is not None and eps_by_layer:
            g["eps"] = eps_by_layer[layer]
        if layer is not None and lr_by_layer:
            g["lr"] = lr_by_layer[layer]
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(groups, lr=LR)
    else:
        opt = AnchoredAdamW(groups, anchors, lr=LR, eps=EPS, weight_decay=0.0)
    schedule = build_scheduler(opt, "linear", total_steps=steps + 1, warmup_ratio=0.34)
    for ids in batches(steps):
        lm_loss(trainable.module(input_ids=ids).logits, ids).backward()
        opt.step()
        schedule.step()
        opt.zero_grad()
    return {name: p.detach().clone() for name, p in trainable.slices.named_parameters()}


def layer_of_delta(name: str) -> int:
    return int(name.split("__")[2])  # deltas.model__layers__L__self_attn__q_proj.weight


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_adamw_divides_the_gradient_scale_out_except_through_eps() -> None:
    scaled, plain = train_deltas("gradient"), train_deltas("none")
    step = max(float(d.abs().max()) for d in plain.values())
    assert step > 1e-3  # the slices trained
    assert max_diff(scaled, plain) <= 1e-4 * step
    same_eps = train_deltas("none", eps_by_layer={layer: EPS / c for layer, c in SCALE.items()})
    assert max_diff(scaled, same_eps) <= 1e-12 * step


def test_sgd_steps_are_multiplied_by_h_over_h_l() -> None:
    scaled, plain = train_deltas("gradient", "sgd", steps=2), train_deltas("none", "sgd", steps=2)  # lr 0, then lr
    for name, delta in plain.items():
        assert float(delta.abs().max()) > 0
        torch.testing.assert_close(scaled[name], SCALE[layer_of_delta(name)] * delta, rtol=1e-12, atol=0)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_learning_rate_form_equals_per_group_lr_by_hand(optimizer: str) -> None:
    lr_form = train_deltas("learning-rate", optimizer)
    by_hand = train_deltas("none", optimizer, lr_by_layer={layer: LR * c for layer, c in SCALE.items()})
    assert max_diff(lr_form, by_hand) == 0.0
    if optimizer == "adamw":  # under AdamW the lr form moves the slices, the gradient form hardly does
        plain, gradient = train_deltas("none"), train_deltas("gradient")
        assert max_diff(lr_form, plain) > 1e3 * max_diff(gradient, plain)


def test_head_slice_groups_carry_each_layers_lr_scale() -> None:
    for head_scale, expected in (("learning-rate", SCALE), ("gradient", {0: 1.0, 1: 1.0}), ("none", {0: 1.0, 1: 1.0})):
        trainable = PreciseTrainable(view_of("llama"), HEADS, [0], head_scale)
        groups, _ = trainable.optimizer_groups(WD)
        heads = [g for g in groups if layer_of(g) is not None]
        assert {layer_of(g): g["lr_scale"] for g in heads} == expected
        assert all(g.get("lr_scale", 1.0) == 1.0 for g in groups if layer_of(g) is None)  # the MLP trains at lr
        assert {g["lr"] for g in with_group_lrs(heads, LR)} == {LR * c for c in expected.values()}
