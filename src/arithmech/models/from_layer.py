"""Rows that join a forward pass at a later layer: each runs only the layers where it can differ.

Background
    A patch or ablation at layer l leaves every layer below l as it was in the reference run, and a patch at
    END leaves every earlier position as it was. So a patched row (one intervention on one prompt) needs only
    layers l.., from the reference residual entering l, and only the positions from the first one it changes,
    on the reference run's keys/values of the positions before. Running every row from layer 0 (or from
    position 0) recomputes what one reference pass already holds.

How
    One call of the model's own forward per block of rows, so every family's masks, positions (rotary,
    sliding windows, Gemma's per-layer-type masks) and cache handling are the model's own. The batch the model
    is called with is the prompts: their tokens (positions start.., the embedding is discarded), attention
    mask and key/value cache of the positions before (`prefix_cache`). A forward pre-hook on each decoder layer
    l replaces its input by the rows that joined at earlier layers (the layer below's output) followed by those
    joining at l, so rows must come sorted by layer; it maps every per-prompt argument of the layer (attention
    mask, position embeddings, ...: a tensor whose first dimension is the number of prompts) to the rows'
    prompts, and the cache to `_RowCache`, whose `update` returns each row's prompt's cached keys followed by
    the row's own new ones and stores nothing. Rows of layer n_layers join at the final norm.

    Per row, the work is (n_layers - layer) x positions token-layers instead of n_layers x positions; the
    layers below a row's layer run only on the rows that have joined so far (below the first row's layer, on one
    stand-in row, since a layer cannot run on an empty batch).

Usage
    >>> ref_cache = full_cache()  # pass as the reference run's cache: keeps every position of every layer
    >>> rows = JoiningRows(prompt=p, layer=l, resid=x)  # [row], [row] sorted, [row, pos, d_model]
    >>> with hooks(...):  # the caller's own patches, indexed by row in this order
    ...     final = run_from_layers(view, rows, ids[:, -1:], prefix=prefix_cache(view, ref_cache, prompts, end))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache

from arithmech.models.hooks import hooks
from arithmech.models.view import ModelView, cache_kwarg


@dataclass(frozen=True)
class JoiningRows:
    """Rows of one call: each row's prompt, the layer it joins at and the residual it brings."""

    prompt: torch.Tensor  # [row] long: the row's prompt, an index into the call's batch
    layer: torch.Tensor  # [row] long, non-decreasing: the decoder layer the row enters (n_layers: the final norm)
    resid: torch.Tensor  # [row, pos, d_model]: the residual entering that layer

    def __post_init__(self) -> None:
        if len(self.layer) > 1 and bool((self.layer[1:] < self.layer[:-1]).any()):
            raise ValueError("JoiningRows must be sorted by layer: rows join the batch in order")


def full_cache() -> DynamicCache:
    """An empty cache that keeps every position of every layer, also of sliding-window layers.

    Given to a reference pass, it holds the keys/values of any prefix, of any of its prompts, at any length.
    """
    return DynamicCache()


def prefix_cache(view: ModelView, cache: Cache, prompts: torch.Tensor, length: int) -> DynamicCache:
    """The model's own cache of positions < `length` of some prompts, indexed out of a `full_cache` run.

    Built as the model would build it on those positions (sliding-window layers keep their window), so the
    masks the model makes from it fit what `_RowCache` returns.
    """
    out = DynamicCache(config=view.model.config)
    for layer, kept in enumerate(cache.layers):
        rows = prompts.to(kept.keys.device)
        out.update(kept.keys[rows, :, :length], kept.values[rows, :, :length], layer)
    return out


def shared_cache(cache: Cache, length: int) -> DynamicCache:
    """The first `length` positions of every row of a `full_cache` run, for a run that shares them."""
    return DynamicCache(ddp_cache_data=[(k.keys[:, :, :length], k.values[:, :, :length]) for k in cache.layers])


def layer_inputs(
    view: ModelView, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: Sequence[int]
) -> dict[int, torch.Tensor]:
    """A plain run's residual entering each of `layers` [prompt, pos, d_model] (n_layers: the final norm): where
    rows that change nothing below those layers start."""
    out: dict[int, torch.Tensor] = {}

    def save(layer: int) -> Callable[..., None]:
        return lambda _module, args: out.__setitem__(layer, args[0].detach())

    n_layers = view.dims.n_layers
    modules = [(view.attn_norm(layer) if layer < n_layers else view.final_norm, save(layer)) for layer in layers]
    device = view.o_proj(0).weight.device
    with hooks(pre=modules):
        view.model.base_model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False)
    return out


def run_from_layers(
    view: ModelView,
    rows: JoiningRows,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    prefix: Cache | None = None,
) -> torch.Tensor:
    """The residual entering the final norm [row, pos, d_model] of every row.

    input_ids [prompt, pos]: the tokens at the rows' positions (after the prefix); attention_mask covers the
    prefix and these positions, as for any cached call; prefix: the prompts' cache of the positions before.
    """
    n_prompts, n_layers = int(input_ids.shape[0]), view.dims.n_layers
    if len(rows.layer) == 0:
        raise ValueError("run_from_layers needs at least one row")
    layers = rows.layer.tolist()
    counts = [sum(1 for x in layers if x <= layer) for layer in range(n_layers + 1)]  # rows joined by each layer
    final: list[torch.Tensor] = []

    def joined(layer: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input [rows so far, pos, d_model] and the rows' prompts."""
        before, now = (counts[layer - 1] if layer > 0 else 0), counts[layer]
        if now == 0:  # no row has joined yet: one stand-in row (prompt 0) keeps the layers' shapes valid
            return hidden[:1], rows.prompt.new_zeros(1)
        carried = hidden if before > 0 else hidden[:0]  # the embedding or the stand-in row is no row
        new = rows.resid[before:now].to(hidden.device, hidden.dtype)
        return torch.cat([carried, new]), rows.prompt[:now]

    def block_hook(layer: int) -> Callable[..., Any]:
        def fn(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
            if args:
                hidden, which = joined(layer, args[0])
                remap = _Remap(which, n_prompts)
                return (hidden, *remap(args[1:])), remap(kwargs)
            hidden, which = joined(layer, kwargs["hidden_states"])
            return args, {**_Remap(which, n_prompts)(kwargs), "hidden_states": hidden}

        return fn

    def final_hook(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        final.append(joined(n_layers, args[0])[0])
        return (final[-1], *args[1:])

    device = view.o_proj(0).weight.device
    inputs: dict[str, Any] = {"input_ids": input_ids.to(device), "use_cache": prefix is not None}
    if attention_mask is not None:
        inputs["attention_mask"] = attention_mask.to(device)
    if prefix is not None:
        inputs[cache_kwarg(view.model.base_model)] = prefix
    blocks = [(view.blocks[layer], block_hook(layer)) for layer in range(n_layers)]
    with hooks(pre=[(view.final_norm, final_hook)], pre_kwargs=blocks):
        view.model.base_model(**inputs)
    return final[-1]


class _Remap:
    """Maps a decoder layer's per-prompt arguments to its rows: tensors by the rows' prompts, the cache to
    `_RowCache`; anything else (positions shared by all prompts, flags) is passed on as it is."""

    def __init__(self, prompts: torch.Tensor, n_prompts: int) -> None:
        self.prompts, self.n_prompts = prompts, n_prompts

    def __call__(self, value: Any) -> Any:
        if isinstance(value, Cache):
            return _RowCache(value, self)
        if isinstance(value, torch.Tensor):
            return self.rows(value) if value.dim() >= 2 and value.shape[0] == self.n_prompts else value
        if isinstance(value, tuple | list):
            return type(value)(self(v) for v in value)
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        return value

    def rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """[prompt, ...] -> [row, ...]; a view when there is one prompt."""
        if self.n_prompts == 1:
            return tensor.expand(len(self.prompts), *tensor.shape[1:])
        return tensor.index_select(0, self.prompts.to(tensor.device))


class _RowCache:
    """The prefix cache as the decoder layers of the rows see it: read-only, each row its prompt's keys."""

    def __init__(self, cache: Cache, remap: _Remap) -> None:
        self.cache, self.remap = cache, remap

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values the layer attends to: [row, kv_head, prefix + pos, d_head] each."""
        kept = self.cache.layers[layer_idx]
        keys = torch.cat([self.remap.rows(kept.keys), key_states], dim=-2)
        values = torch.cat([self.remap.rows(kept.values), value_states], dim=-2)
        return keys, values
