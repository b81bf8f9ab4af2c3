"""Count the work of a computation in forward passes of a batch: deterministic, whatever the machine.

The unit of work is a multiply-accumulate of a linear layer: each call of an `nn.Linear` or GPT-2 `Conv1D`
adds (input rows) x in_features x out_features. That covers every projection of attention and MLP, and the
unembedding when it goes through the model's module (a whole-vocabulary readout is counted, reading one
answer row is not). Attention scores, norms and element-wise work are left out: at the prompt lengths
patching uses they are a few percent of a layer.

Two units of a forward pass:

- `prompt_forward_macs`, the unit the docs and the README count in ("forward passes of the prompts"): every
  prompt at its own length, no padding, and the vocabulary projection of its last token only; what a loop of
  one forward pass per component needs to read the answer logit, so that loop costs one such pass per
  component;
- `plain_forward_macs`, the padded unit: what `model(input_ids, attention_mask)` of the CausalLM costs on the
  right-padded batch, the logits of every position included (what TransformerLens and nnsight run once per
  patched component). On the default reference set it is about twice the first (padding to 70 tokens from a
  mean of 45, and SmolLM2's vocabulary projection, a fifth of a full-logit pass), so counts in it look smaller.

    >>> with count_work(model) as work:
    ...     path_patch(view, batch, "total")
    >>> work.macs / prompt_forward_macs(model, batch.ref_ids, batch.ref_mask)
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


@torch.no_grad()
def prompt_forward_macs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """The multiply-accumulates of one forward pass of the prompts: each right-padded row at its own length (the
    rows of each length run together, unpadded) and the vocabulary projection of its last token only."""
    lengths = attention_mask.sum(1)  # [batch]
    with count_work(model) as work:
        for n in lengths.unique().tolist():
            rows = lengths == n
            hidden = model.base_model(
                input_ids=input_ids[rows, :n], attention_mask=attention_mask[rows, :n], use_cache=False
            ).last_hidden_state  # [rows, n, d_model]
            model.get_output_embeddings()(hidden[:, -1])  # [rows, d_vocab]
    return work.macs
