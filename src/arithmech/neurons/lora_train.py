"""Training a LoRA adapter on chosen layers to predict the answer token at END (Yu & Ananiadou 2024).

Background
    Yu & Ananiadou (2024) fine-tune a model with LoRA on arithmetic and find that the adapter raises the
    probability of the correct answer by amplifying the activation coefficients of the FFN neurons related to
    the prediction. `train_layer_lora` trains such an adapter on chosen modules of chosen layers and returns it
    detached from the model (`lora_adapter.LoraAdapter`); `lora_effect.py` measures what it moved.
    (METHODS.md sec. 6.)

Formula
    Each target projection W [out, in] becomes  W + (alpha / r) * B A  with A [r, in], B [out, r]. Training
    minimises the cross-entropy of the answer token at END only,

        loss = mean over prompts of  -log softmax(logits at END)[answer]

    with AdamW on A and B alone (every base parameter frozen). A ~ U(-1/sqrt(in), 1/sqrt(in)) (peft's default
    kaiming bound) drawn from a local generator seeded with `seed`, B = 0, so the fresh adapter is an exact
    no-op; minibatch order comes from the same generator, so a seed fixes the whole run (on one device).
    Training runs in the model's current mode (eval after `load_model`: no dropout).

Which modules
    `LoraTrainConfig.modules` names modules per block through the model's ArchSpec, not llama names: "mlp"
    = every linear projection inside the MLP (gate/up/down, c_fc/c_proj, dense_h_to_4h/dense_4h_to_h,
    fused gate_up_proj), "attn" = every linear projection inside the attention module (q/k/v/o, fused
    qkv_proj / c_attn), or a dotted path inside the block ("mlp.down_proj"). GPT-2's Conv1D is handled by
    peft's fan_in_fan_out.

Usage
    >>> cfg = LoraTrainConfig(layers=(20,), modules=("mlp",), rank=4, steps=40)
    >>> adapter = train_layer_lora(handle, ids, mask, end, answers, cfg)   # the model itself is left unchanged
    >>> adapter.losses[0], adapter.losses[-1]                              # loss of the first and last step

References: Yu & Ananiadou, EMNLP 2024 (arXiv 2409.14144), LoRA analysis; Hu et al., "LoRA", ICLR 2022;
METHODS.md sec. 6.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from arithmech.errors import ConfigError
from arithmech.models.load import ModelHandle
from arithmech.models.view import ModelView
from arithmech.neurons.lora_adapter import LoraAdapter, injected

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraTrainConfig:
    """Where to put a LoRA adapter and how to train it."""

    layers: tuple[int, ...] = field(metadata={"help": "decoder layers that get the adapter"})
    modules: tuple[str, ...] = field(
        default=("mlp",), metadata={"help": "mlp, attn, or dotted paths inside a block (mlp.down_proj)"}
    )
    rank: int = field(default=8, metadata={"help": "LoRA rank r"})
    alpha: float = field(default=16.0, metadata={"help": "LoRA alpha; the update is scaled by alpha / rank"})
    steps: int = field(default=40, metadata={"help": "optimizer steps"})
    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate"})
    batch_size: int = field(default=16, metadata={"help": "prompts per step"})
    seed: int = field(default=0, metadata={"help": "seed of the A initialisation and the minibatch order"})

    def __post_init__(self) -> None:
        for name in ("layers", "modules"):
            value = getattr(self, name)
            if isinstance(value, (list, int, str)):
                object.__setattr__(self, name, tuple(value) if isinstance(value, list) else (value,))
        if not self.layers:
            raise ConfigError("layers is empty; name at least one layer to put the LoRA adapter on")
        if not self.modules:
            raise ConfigError("modules is empty; use mlp, attn or a dotted module path inside a block")
        for name in ("rank", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.steps < 0:
            raise ConfigError(f"steps must be 0 or more (got {self.steps})")
        if not self.lr > 0:
            raise ConfigError(f"lr must be positive (got {self.lr})")


def target_module_names(view: ModelView, layers: Sequence[int], modules: Sequence[str]) -> list[str]:
    """Full names (from the model root) of the linear projections that `modules` selects in `layers`."""
    from transformers.pytorch_utils import Conv1D

    n = view.dims.n_layers
    bad = [layer for layer in layers if not 0 <= int(layer) < n]
    if bad:
        raise ConfigError(f"layers {bad} do not exist: the model has layers 0..{n - 1}")
    names_of = {id(m): name for name, m in view.model.named_modules()}
    found: list[str] = []
    for layer in layers:
        for entry in modules:
            path = {"mlp": view.spec.mlp, "attn": view.spec.attn}.get(entry, entry)
            try:
                root = view.module(int(layer), path)
            except AttributeError:
                raise ConfigError(
                    f"module {entry!r} is not in block {layer} of this {view.spec.name} model; use mlp, attn or "
                    "a dotted path inside a block"
                ) from None
            leaves = [m for m in root.modules() if isinstance(m, (nn.Linear, Conv1D))]
            if not leaves:
                raise ConfigError(f"module {entry!r} of block {layer} holds no linear projection to adapt")
            found += [names_of[id(m)] for m in leaves if names_of[id(m)] not in found]
    return found


def answer_loss(
    view: ModelView, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor, answer_ids: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of the answer token at END (a scalar that carries gradients)."""
    width = int(end.max()) + 1
    logits = view.end_logits(ids[:, :width], mask[:, :width], end)  # [row, d_vocab] float32
    return torch.nn.functional.cross_entropy(logits, answer_ids.to(logits.device))


def train_layer_lora(
    handle: ModelHandle,
    ids: torch.Tensor,
    mask: torch.Tensor,
    end: torch.Tensor,
    answer_ids: torch.Tensor,
    cfg: LoraTrainConfig,
) -> LoraAdapter:
    """Train a LoRA adapter on `cfg.modules` of `cfg.layers` to predict each prompt's answer token at END.

    ids/mask: right-padded prompts [row, pos]; end: [row] last real token; answer_ids: [row]. The model is
    left unchanged; the adapter comes back detached (apply it with `applied_lora`). Gradients are on inside,
    also when the caller runs under `torch.no_grad()` (as the neurons stage does).
    """
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    if len(end) == 0:
        raise ConfigError("there are no training prompts; give at least one tokenized prompt")
    view = handle.view
    targets = target_module_names(view, cfg.layers, cfg.modules)
    config = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=0.0,
        target_modules=targets,
        fan_in_fan_out=view.spec.conv1d,
        bias="none",
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    losses: list[float] = []
    with injected(handle, lambda model: get_peft_model(model, config)) as peft_model, torch.enable_grad():
        params = _init_lora_a(peft_model, generator)
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        for rows in _minibatches(len(end), cfg.batch_size, cfg.steps, generator):
            loss = answer_loss(view, ids[rows], mask[rows], end[rows], answer_ids[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        state = {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(peft_model).items()}
        config = copy.deepcopy(peft_model.peft_config["default"])
    if losses:
        logger.info("LoRA on %d modules: loss %.4f -> %.4f in %d steps", len(targets), losses[0], losses[-1], cfg.steps)
    return LoraAdapter(config, state, tuple(losses))


def _init_lora_a(peft_model: Any, generator: torch.Generator) -> list[nn.Parameter]:
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) from `generator`, B = 0; returns the trainable LoRA parameters."""
    params = []
    for name, p in peft_model.named_parameters():
        if "lora_" not in name:
            continue
        with torch.no_grad():
            if ".lora_A." in name:
                bound = 1.0 / math.sqrt(p.shape[1])
                draw = torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1  # [r, in]
                p.copy_((draw * bound).to(p.dtype))
            else:
                p.zero_()
        p.requires_grad_(True)
        params.append(p)
    return params


def _minibatches(n: int, size: int, steps: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """`steps` minibatches of row indices: shuffled epochs from `generator`, or all rows if n <= size."""
    order = torch.empty(0, dtype=torch.long)
    for _ in range(steps):
        if n <= size:
            yield torch.arange(n)
            continue
        if len(order) < size:
            order = torch.cat([order, torch.randperm(n, generator=generator)])
        yield order[:size]
        order = order[size:]
