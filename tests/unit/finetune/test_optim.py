"""AnchoredAdamW on slice deltas == torch AdamW on the full matrices, restricted to the slice entries.

The reference trains the whole q/k/v/o matrices with torch.optim.AdamW (weight decay on weights, none on biases),
with gradients multiplied by H / h_l on the slice and zeroed elsewhere, and puts the entries outside the slice
back to their base values after every step (decoupled decay would otherwise move them, and change the next
step's gradients). Adam is elementwise, so the slice entries then follow full-matrix AdamW exactly.

Both runs are in float64: the key bias of a head has a gradient that is zero in exact arithmetic (softmax ignores a
shift shared by all keys), and Adam would turn float32 rounding noise there into lr-sized, run-dependent updates.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arithmech.finetune.methods import PreciseTrainable
from arithmech.finetune.optim import AnchoredAdamW, build_scheduler
from arithmech.models.archs import spec_for_model_type
from arithmech.models.sites import Component
from arithmech.models.view import ModelView

from tiny_models import make_tiny_model

LR, WD, BETAS, EPS = 1e-2, 0.1, (0.9, 0.95), 1e-8
HEADS = [Component(0, 1), Component(1, 0), Component(1, 3)]


def view_of(arch: str) -> ModelView:
    model = make_tiny_model(arch, seed=0).double()
    return ModelView(model, spec_for_model_type(model.config.model_type))


def batches(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, 250, (2, 8), generator=gen) for _ in range(n)]


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def precise_run(arch: str, steps: int, anchored: bool = True) -> tuple[ModelView, PreciseTrainable]:
    view = view_of(arch)
    trainable = PreciseTrainable(view, HEADS, [], head_scale="gradient")
    groups, anchors = trainable.optimizer_groups(WD)
    if not anchored:  # the wrong way: decay the delta itself (pulls W towards W0, not towards 0)
        for g in groups:
            g["weight_decay"], g["anchored_decay"] = g.pop("anchored_decay", 0.0), 0.0
    opt = AnchoredAdamW(groups, anchors, lr=LR, betas=BETAS, eps=EPS)
    for ids in batches(steps):
        lm_loss(trainable.module(input_ids=ids).logits, ids).backward()
        opt.step()
        opt.zero_grad()
    trainable.finish()
    return view, trainable


def reference_run(arch: str, trainable: PreciseTrainable, steps: int) -> dict[str, torch.Tensor]:
    """Full-matrix AdamW on the touched modules, restricted to the slices; returns the trained tensors by name."""
    view = view_of(arch)
    model = view.model
    for p in model.parameters():
        p.requires_grad_(False)
    scales: dict[str, torch.Tensor] = {}
    for key, delta in trainable.slices.deltas.items():
        name = trainable.slices.target_names[key]
        module = model.get_submodule(name)
        for pname in ("weight", "bias") if delta.bias is not None else ("weight",):
            param = getattr(module, pname)
            scale = torch.zeros_like(param)
            dim = delta.dim if pname == "weight" else 0
            scale.index_fill_(dim, delta.index, delta.grad_scale)
            scales[f"{name}.{pname}"] = scale
            param.requires_grad_(True)
    params = dict(model.named_parameters())
    base = {name: params[name].detach().clone() for name in scales}
    opt = torch.optim.AdamW(
        [
            {"params": [params[n] for n in scales if n.endswith("weight")], "weight_decay": WD},
            {"params": [params[n] for n in scales if n.endswith("bias")], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=BETAS,
        eps=EPS,
    )
    for ids in batches(steps):
        lm_loss(model(input_ids=ids).logits, ids).backward()
        for name, scale in scales.items():
            params[name].grad.mul_(scale)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for name, scale in scales.items():
                outside = scale == 0
                params[name][outside] = base[name][outside]
    return {name: params[name].detach() for name in scales}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("steps", [1, 2])
def test_anchored_adamw_equals_full_matrix_adamw_on_the_slice(arch: str, steps: int) -> None:
    view, trainable = precise_run(arch, steps)
    reference = reference_run(arch, trainable, steps)
    params = dict(view.model.named_parameters())
    for name, want in reference.items():
        torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6)
    assert any(name.endswith("bias") for name in reference) == (arch == "gpt2")


def test_decaying_the_delta_alone_is_detectably_different() -> None:
    """The negative control: the same check fails when decay acts on the delta instead of W0 + delta."""
    view, trainable = precise_run("llama", 2, anchored=False)
    reference = reference_run("llama", trainable, 2)
    params = dict(view.model.named_parameters())
    worst = max(float((params[n] - w).abs().max()) for n, w in reference.items())
    assert worst > 1e-5


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_schedule_warms_up_then_decays_to_zero(schedule: str) -> None:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=2e-5)
    sched = build_scheduler(opt, schedule, total_steps=100, warmup_ratio=0.02)
    lrs = []
    for _ in range(100):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(1e-5) and lrs[2] == pytest.approx(2e-5)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:], strict=False))
    assert sched.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)
    assert lrs[51] == pytest.approx(1e-5, rel=0.05)  # halfway through the decay: half the peak for both shapes
