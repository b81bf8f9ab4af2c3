"""Count the work of a computation in forward passes of a batch: deterministic, whatever the machine.

The unit of work is a multiply-accumulate of a linear layer: each call of an `nn.Linear` or GPT-2 `Conv1D`
adds (input rows) x in_features x out_features. That covers every projection of attention and MLP, and the
unembedding when it goes through the model's module (a whole-vocabulary readout is counted, reading one
answer row is not). Attention scores, norms and element-wise work are left out: at the prompt lengths
patching uses they are a few percent of a layer.

One forward pass of a batch is what `model(input_ids, attention_mask)` of the CausalLM costs on it, the
logits of every position included: what TransformerLens and nnsight run once per patched component. So
`forward_passes(...)` of 6.0 means as much work as six such passes.

    >>> with count_work(model) as work:
    ...     path_patch(view, batch, "total")
    >>> work.macs / plain_forward_macs(model, batch.ref_ids, batch.ref_mask)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from arithmech.models.hooks import hooks
from arithmech.models.view import ModelView


@dataclass
class Work:
    """Multiply-accumulates counted so far."""

    macs: int = 0


@contextmanager
def count_work(model: nn.Module) -> Iterator[Work]:
    """Count the linear layers' multiply-accumulates of everything `model` runs inside the block."""
    work = Work()

    def add(module: Any, args: tuple[Any, ...]) -> None:
        x = args[0]
        out_features = module.weight.shape[0] if isinstance(module, nn.Linear) else module.weight.shape[1]
        work.macs += x.numel() * int(out_features)  # rows x in_features x out_features

    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, Conv1D))]
    with hooks(pre=[(m, add) for m in linears]):
        yield work


@contextmanager
def count_layer_tokens(view: ModelView) -> Iterator[list[int]]:
    """Tokens (rows x positions) entering each decoder layer inside the block: which layers a scan runs."""
    seen = [0] * view.dims.n_layers

    def count(layer: int) -> Any:
        return lambda _module, args: seen.__setitem__(layer, seen[layer] + args[0].shape[:-1].numel())

    with hooks(pre=[(view.attn_norm(layer), count(layer)) for layer in range(view.dims.n_layers)]):
        yield seen


@torch.no_grad()
def plain_forward_macs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """The multiply-accumulates of one plain forward pass of the batch, logits of every position included."""
    with count_work(model) as work:
        model(input_ids=input_ids, attention_mask=attention_mask)
    return work.macs
