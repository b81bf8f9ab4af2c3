"""AdamW whose weight decay acts on the effective weight of a delta, and the learning-rate schedule.

Background
    Decoupled weight decay (Loshchilov & Hutter 2019, torch.optim.AdamW) shrinks a weight before the Adam update:
    W <- W - lr * wd * W - lr * adam(g). Precise SFT trains a delta Delta on top of frozen entries W0, so the
    trained weight is W = W0 + Delta. Decaying Delta alone would pull W towards W0, not towards zero as full
    fine-tuning does. `AnchoredAdamW` decays the effective weight instead:

        Delta <- Delta - lr * wd * (W0 + Delta) - lr * adam(g)

    which is, entry for entry, full-matrix AdamW restricted to the slice (tested to 1e-6). Adam's moments are
    elementwise, so they need no change.

    Which parameters decay (nanoGPT's rule, also how the HF Trainer treats biases and norms): matrices (dim >= 2,
    including embeddings) decay, vectors (biases, norm weights) do not. For precise SFT, slice deltas of weights
    decay through their anchor, bias deltas do not decay.

Schedule
    Linear warm-up from 0 over ceil(warmup_ratio * total_steps) steps, then linear decay to 0 (the HF Trainer's
    default, used by LLM-Adapters) or cosine decay to 0; `transformers.get_scheduler` builds both. A group with
    an `lr_scale` (precise SFT's learning-rate form of H / h_l) starts at lr * lr_scale (`with_group_lrs`) and
    the schedule multiplies every group's own lr by the same factor, so the ratios hold at every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

Anchor = Callable[[], torch.Tensor]


class AnchoredAdamW(torch.optim.AdamW):
    """torch AdamW, plus decoupled decay of `anchor() + param` for groups that set `anchored_decay`.

    Groups with `anchored_decay` must have `weight_decay` 0 (their decay is done here, on the effective weight).
    `anchors` maps id(param) to a function returning the frozen entries the parameter is added to. They are read
    once, at the first step, and kept by position in the group, so the optimizer survives its parameters being
    replaced by sharded ones (FSDP2 through accelerate); a sharded parameter gets its anchor sharded alike.
    """

    def __init__(self, params: Iterable[dict[str, Any]], anchors: Mapping[int, Anchor], **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self._anchors: list[list[Anchor] | None] = []
        for group in self.param_groups:
            if not group.get("anchored_decay", 0.0):
                self._anchors.append(None)
                continue
            assert group["weight_decay"] == 0.0, "an anchored group must not also decay the delta itself"
            assert all(id(p) in anchors for p in group["params"]), "every anchored parameter needs an anchor"
            self._anchors.append([anchors[id(p)] for p in group["params"]])
        self._anchor_values: dict[tuple[int, int], torch.Tensor] = {}

    def _anchor(self, group: int, position: int, param: torch.Tensor) -> torch.Tensor:
        key = (group, position)
        if key not in self._anchor_values:
            anchors = self._anchors[group]
            assert anchors is not None
            value = anchors[position]().to(device=param.device, dtype=param.dtype)
            if isinstance(param, DTensor):
                value = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
            self._anchor_values[key] = value
        return self._anchor_values[key]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        for g, group in enumerate(self.param_groups):
            decay = group.get("anchored_decay", 0.0)
            if not decay:
                continue
            for i, p in enumerate(group["params"]):
                if p.grad is not None:  # as torch AdamW: a parameter without a gradient is left alone
                    p.sub_(group["lr"] * decay * (self._anchor(g, i, p) + p))
        return super().step(closure)


def decay_groups(named: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: matrices (dim >= 2) with `weight_decay`, vectors without; trainable parameters only."""
    decay, no_decay = [], []
    for _, p in named:
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


def with_group_lrs(groups: Iterable[dict[str, Any]], lr: float) -> list[dict[str, Any]]:
    """The groups with their own lr = lr * group["lr_scale"] (1 when absent); the schedule then scales each."""
    return [{**g, "lr": lr * g.get("lr_scale", 1.0)} for g in groups]


def build_scheduler(
    optimizer: torch.optim.Optimizer, schedule: str, total_steps: int, warmup_ratio: float
) -> torch.optim.lr_scheduler.LRScheduler:
    """Warm-up then linear or cosine decay to zero, stepped once per optimizer step."""
    from transformers import get_scheduler

    warmup = math.ceil(total_steps * warmup_ratio)
    return get_scheduler(schedule, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
