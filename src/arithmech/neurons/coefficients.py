"""FFN neurons as key-value memories: activation coefficients, value vectors, and masking.

Background
    Yu & Ananiadou (2024) read an FFN layer as a sum of neurons (Geva et al. 2021): neuron k of layer l has an
    activation coefficient m_lk (computed from the residual by the up/gate projections and the nonlinearity)
    and a value vector v_lk = W_down[:, k] (the column of the down projection that neuron k writes through).
    The MLP output is

        mlp_out = sum_k m_lk * W_down[:, k] + b_down                     [d_model]

    so neuron k adds m_lk * v_lk to the residual stream. The coefficients are exactly the input of the MLP's
    down projection (`ModelView.down_proj`), which is where this module reads and masks them.

Shapes
    end_coefficients(view, ids, mask, end, layers)  [row, len(layers), d_mlp]  m at each row's END
    value_vectors(view, layer)                      [d_mlp, d_model]           row k = W_down[:, k]
    mask_neurons(view, {layer: kept [n]})           context manager: every other neuron of `layer` reads 0

    GPT-2's Conv1D stores the down projection as (in, out) = [d_mlp, d_model], nn.Linear as (out, in) =
    [d_model, d_mlp]; `value_vectors` returns [d_mlp, d_model] for both. Gemma 2/3 apply a post-MLP norm to
    the MLP output before it joins the residual: there the residual receives norm(sum_k m_k v_k), and the value
    vectors are those of the down projection, before that norm.

Usage
    >>> m = end_coefficients(view, ids, mask, end, layers=[20, 21])     # [row, 2, d_mlp]
    >>> v = value_vectors(view, 20)                                      # [d_mlp, d_model]
    >>> with mask_neurons(view, {20: torch.tensor([5, 17])}):
    ...     logits = view.end_logits(ids, mask, end)                     # layer 20 keeps neurons 5 and 17 only

References: Yu & Ananiadou, "Interpreting Arithmetic Mechanism in Large Language Models through Comparative
Neuron Analysis", EMNLP 2024 (arXiv 2409.14144), sec. 2; Geva et al., EMNLP 2021; METHODS.md sec. 6.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from arithmech.errors import ConfigError
from arithmech.models.hooks import hooks
from arithmech.models.view import ModelView


def d_mlp(view: ModelView, layer: int) -> int:
    """Number of FFN neurons of `layer` (the width of its down projection's input)."""
    w = view.down_proj(layer).weight
    return int(w.shape[0] if view.spec.conv1d else w.shape[1])


def value_vectors(view: ModelView, layer: int) -> torch.Tensor:
    """[d_mlp, d_model]: row k is W_down[:, k], what neuron k writes per unit of its coefficient (a view)."""
    _check_layers(view, (layer,))
    w = view.down_proj(layer).weight
    return w if view.spec.conv1d else w.T  # [d_mlp, d_model]


def down_proj_bias(view: ModelView, layer: int) -> torch.Tensor | None:
    """The down projection's bias [d_model] (None for bias-free families such as Llama)."""
    return getattr(view.down_proj(layer), "bias", None)


@torch.no_grad()
def end_coefficients(
    view: ModelView, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor, layers: Sequence[int]
) -> torch.Tensor:
    """Activation coefficients m at each row's END: [row, len(layers), d_mlp] (float32, on the CPU).

    ids/mask: a right-padded batch [row, pos]; end: [row] index of each row's last real token. One forward
    pass; a pre-hook on each layer's down projection reads its input at END.
    """
    layers = tuple(layers)
    _check_layers(view, layers)
    rows = torch.arange(len(end))
    found: dict[int, torch.Tensor] = {}

    def read(index: int) -> Any:
        def fn(_m: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0]  # [row, pos, d_mlp]
            found[index] = x[rows.to(x.device), end.to(x.device)].detach().float().cpu()  # [row, d_mlp]

        return fn

    device = view.o_proj(0).weight.device
    last = int(end.max()) + 1
    with hooks(pre=[(view.down_proj(layer), read(i)) for i, layer in enumerate(layers)]):
        view.model.base_model(
            input_ids=ids[:, :last].to(device), attention_mask=mask[:, :last].to(device), use_cache=False
        )
    return torch.stack([found[i] for i in range(len(layers))], dim=1)  # [row, layer, d_mlp]


@contextmanager
def mask_neurons(view: ModelView, keep: Mapping[int, torch.Tensor | Sequence[int]]) -> Iterator[None]:
    """Zero every neuron of each layer in `keep` except the kept ones, at every position, during the block.

    keep: {layer: indices of the neurons to keep}. Layers not in `keep` are untouched; an empty mapping
    registers no hook at all, so the model runs bit-identically.
    """
    _check_layers(view, tuple(keep))
    pre = []
    for layer, kept in keep.items():
        width = d_mlp(view, layer)
        idx = torch.as_tensor(list(kept) if not isinstance(kept, torch.Tensor) else kept, dtype=torch.long)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= width):
            raise ConfigError(f"kept neurons of layer {layer} must be indices in 0..{width - 1}")
        gate = torch.zeros(width, dtype=torch.bool)
        gate[idx] = True
        pre.append((view.down_proj(layer), _keep_hook(gate)))
    with hooks(pre=pre):
        yield


def _keep_hook(gate: torch.Tensor) -> Any:
    """Pre-hook on a down projection: neurons outside `gate` [d_mlp] read zero."""

    def fn(_m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]  # [row, pos, d_mlp]
        kept = torch.where(gate.to(x.device), x, torch.zeros((), dtype=x.dtype, device=x.device))
        return (kept, *args[1:])

    return fn


def _check_layers(view: ModelView, layers: tuple[int, ...]) -> None:
    n = view.dims.n_layers
    bad = [layer for layer in layers if not 0 <= int(layer) < n]
    if bad:
        raise ConfigError(f"layers {bad} do not exist: the model has layers 0..{n - 1}")
