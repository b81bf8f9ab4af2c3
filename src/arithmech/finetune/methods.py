"""What a fine-tuning method trains: precise (head slices + MLPs), full (every parameter) or LoRA (peft).

Each method is a `Trainable`: the module the training loop calls (and accelerate wraps), its optimizer parameter
groups (with the anchors of precise SFT's deltas), the tensors a checkpoint must hold, and `finish`, which
writes the training into the base model and returns what changed as `DeltaEntry`s.

- precise: `PreciseModel` over `PreciseSlices` (finetune/head_slices.py); only the deltas and chosen MLPs train.
- full: every parameter of the model trains (the paper's "Full SFT" baseline).
- lora: peft LoRA adapters (Hu et al. 2022) on the attention projections of every layer (q/k/v/o, or the fused
  qkv and o projections), rank `r`, scale `alpha / r`; `finish` merges them, and what changed is those projections'
  weights. The adapter itself is also saved (`save_native`), which is far smaller.
All three start from the same frozen-by-default state and use the same loop, data, schedule and optimizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from arithmech.finetune.head_slices import DeltaEntry, PreciseModel, PreciseSlices, SliceDelta
from arithmech.finetune.optim import Anchor, decay_groups
from arithmech.models.sites import Component
from arithmech.models.view import ModelView


class Trainable(Protocol):
    method: str
    module: nn.Module
    """What the loop calls with input_ids/attention_mask and accelerate prepares."""

    def optimizer_groups(self, weight_decay: float) -> tuple[list[dict[str, Any]], dict[int, Anchor]]: ...
    def trainable_named(self) -> list[tuple[str, nn.Parameter]]: ...
    def finish(self) -> list[DeltaEntry]: ...
    def save_native(self, out_dir: Path) -> None: ...
    def summary(self) -> dict[str, Any]: ...


def _trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


class PreciseTrainable:
    """Only the selected heads' slices (as deltas) and the selected MLP layers train."""

    method = "precise"

    def __init__(self, view: ModelView, heads: list[Component], mlp_layers: list[int], head_scale: str) -> None:
        self.slices = PreciseSlices(view, heads, mlp_layers, head_scale)
        self.module = PreciseModel(view.model, self.slices)

    def optimizer_groups(self, weight_decay: float) -> tuple[list[dict[str, Any]], dict[int, Anchor]]:
        """Per layer with selected heads: its slice weights (decayed through their anchors) and its slice biases
        (not decayed), both with that layer's `lr_scale`; then the whole MLPs' groups."""
        anchors: dict[int, Anchor] = {}
        groups = []
        for layer in self.slices.layer_scale:
            anchored, no_decay = [], []
            for key, delta in self.slices.deltas.items():
                assert isinstance(delta, SliceDelta)
                if self.slices.delta_layer[key] != layer:
                    continue
                anchored.append(delta.weight)
                anchors[id(delta.weight)] = delta.weight_anchor
                if delta.bias is not None:
                    no_decay.append(delta.bias)
            common = {"weight_decay": 0.0, "lr_scale": self.slices.lr_scale(layer)}
            groups += [
                {"params": anchored, "anchored_decay": weight_decay, "name": f"head_slices.{layer}", **common},
                {"params": no_decay, "name": f"head_slice_biases.{layer}", **common},
            ]
        groups += decay_groups(self.slices.mlp_parameters(), weight_decay)
        return [g for g in groups if g["params"]], anchors

    def trainable_named(self) -> list[tuple[str, nn.Parameter]]:
        return _trainable(self.module)

    def finish(self) -> list[DeltaEntry]:
        self.slices.merge_()
        return self.slices.delta_entries()

    def save_native(self, out_dir: Path) -> None:
        return None

    def summary(self) -> dict[str, Any]:
        return self.slices.summary()


class FullTrainable:
    """Every parameter of the model trains."""

    method = "full"

    def __init__(self, model: nn.Module) -> None:
        for p in model.parameters():
            p.requires_grad_(True)
        self.module = model

    def optimizer_groups(self, weight_decay: float) -> tuple[list[dict[str, Any]], dict[int, Anchor]]:
        return decay_groups(self.module.named_parameters(), weight_decay), {}

    def trainable_named(self) -> list[tuple[str, nn.Parameter]]:
        return _trainable(self.module)

    def finish(self) -> list[DeltaEntry]:
        return [DeltaEntry(name, None, None, p.detach()) for name, p in self.module.named_parameters()]

    def save_native(self, out_dir: Path) -> None:
        return None

    def summary(self) -> dict[str, Any]:
        return {"trainable_parameters": sum(p.numel() for _, p in self.trainable_named())}


def lora_target_modules(view: ModelView) -> list[str]:
    """Full dotted names of every layer's attention projections (exact names, so GPT-2's MLP c_proj is not hit)."""
    spec = view.spec
    paths = [p for p in (spec.q_proj, spec.k_proj, spec.v_proj, spec.qkv_proj, spec.o_proj) if p]
    names = {id(m): name for name, m in view.model.named_modules()}
    return [names[id(view.module(layer, path))] for layer in range(view.dims.n_layers) for path in paths]


class LoraTrainable:
    """peft LoRA adapters on the attention projections; the base model stays frozen until `finish` merges."""

    method = "lora"

    def __init__(self, view: ModelView, r: int, alpha: float, dropout: float, seed: int = 0) -> None:
        """Adapters initialised from `seed` (peft: A random, B zero), leaving the caller's RNG state as it was."""
        from peft import LoraConfig, get_peft_model

        self.base = view.model
        self.targets = lora_target_modules(view)
        config = LoraConfig(
            r=r,
            lora_alpha=alpha,
            lora_dropout=dropout,
            target_modules=self.targets,
            bias="none",
            fan_in_fan_out=view.spec.conv1d,
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):
            torch.manual_seed(seed)
            self.module = get_peft_model(view.model, config)
        self.config = {"r": r, "alpha": alpha, "dropout": dropout, "target_modules": len(self.targets)}

    def optimizer_groups(self, weight_decay: float) -> tuple[list[dict[str, Any]], dict[int, Anchor]]:
        return decay_groups(self.module.named_parameters(), weight_decay), {}

    def trainable_named(self) -> list[tuple[str, nn.Parameter]]:
        return _trainable(self.module)

    def finish(self) -> list[DeltaEntry]:
        merged = self.module.merge_and_unload()  # type: ignore[operator]
        assert merged is self.base
        return [
            DeltaEntry(f"{name}.weight", None, None, merged.get_submodule(name).weight.detach())
            for name in self.targets
        ]

    def save_native(self, out_dir: Path) -> None:
        """The adapter in peft's own format (must run before `finish`)."""
        self.module.save_pretrained(str(out_dir))  # type: ignore[operator]

    def summary(self) -> dict[str, Any]:
        return {"trainable_parameters": sum(p.numel() for _, p in self.trainable_named()), "lora": self.config}


def make_trainable(
    method: str,
    view: ModelView,
    heads: list[Component] | None = None,
    mlp_layers: list[int] | None = None,
    head_scale: str = "gradient",
    lora: dict[str, Any] | None = None,
) -> Trainable:
    """Freeze/unfreeze `view.model` for `method` and return its Trainable."""
    if method == "precise":
        return PreciseTrainable(view, heads or [], mlp_layers or [], head_scale)
    if method == "full":
        return FullTrainable(view.model)
    if method == "lora":
        for p in view.model.parameters():
            p.requires_grad_(False)
        opts = lora or {}
        r, alpha, dropout = int(opts.get("r", 8)), float(opts.get("alpha", 16)), float(opts.get("dropout", 0.05))
        return LoraTrainable(view, r, alpha, dropout, int(opts.get("seed", 0)))
    raise ValueError(f"unknown method {method!r}")


def total_parameters(model: nn.Module) -> int:
    """Parameters of the base model (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def requires_grad_state(model: nn.Module) -> dict[str, bool]:
    return {name: p.requires_grad for name, p in model.named_parameters()}


def restore_requires_grad(model: nn.Module, state: dict[str, bool]) -> None:
    for name, p in model.named_parameters():
        p.requires_grad_(state.get(name, p.requires_grad))

