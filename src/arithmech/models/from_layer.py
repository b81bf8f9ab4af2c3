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
    mask and key/value cache of the positions before (`shared_prefix.prefix_cache`). A forward pre-hook on each
    decoder layer l replaces its input by the rows that joined at earlier layers (the layer below's output)
    followed by those joining at l, so rows must come sorted by layer; it maps every per-prompt argument of the
    layer (attention mask, position embeddings, ...: a tensor whose first dimension is the number of prompts) to
    the rows' prompts, and the cache to `_RowCache`, whose `update` returns each row's prompt's cached keys
    followed by the row's own new ones and stores nothing. Rows of layer n_layers join at the final norm.

    Per row, the work is (n_layers - layer) x positions token-layers instead of n_layers x positions; the
    layers below a row's layer run only on the rows that have joined so far (below the first row's layer, on one
    stand-in row, since a layer cannot run on an empty batch).

Usage
    >>> ref_cache = full_cache()  # models/shared_prefix: the reference run keeps every position of every layer
    >>> rows = JoiningRows(prompt=p, layer=l, resid=x)  # [row], [row] sorted, [row, pos, d_model]
    >>> with hooks(...):  # the caller's own patches, indexed by row in this order
    ...     final = run_from_layers(view, rows, ids[:, -1:], prefix=prefix_cache(view, ref_cache, prompts, end))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache

from arithmech.errors import SpecError
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


@torch.no_grad()
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


@torch.no_grad()
def run_from_layers(
    view: ModelView,
    rows: JoiningRows,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    prefix: Cache | None = None,
) -> torch.Tensor:
    """The residual entering the final norm [row, pos, d_model] of every row (no gradient: a scan engine).

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

    _run_joined(view, block_hook, final_hook, input_ids, attention_mask, prefix)
    return final[-1]


@torch.no_grad()
def decode_from_layers(
    view: ModelView, layer: torch.Tensor, resid: torch.Tensor, input_ids: torch.Tensor, prefix: Cache | None
) -> torch.Tensor:
    """One decoding step of each prompt's last token in many variants ("slots") at once, each slot joining at
    its layer: [prompt, slot, d_model], the residual entering the final norm.

    layer [slot] non-decreasing, resid [prompt, slot, d_model]: what each slot brings to its layer (the same
    slots for every prompt); input_ids [prompt, 1]; prefix: the prompts' cache of the positions before.
    The slots of a prompt are positions of its one sequence, all at the position of the token: the model's
    own attention mask for the step is widened so that each slot sees the prefix as the token would, and
    itself, never another slot. So the prefix keys are read once per prompt and layer, never copied per slot,
    and attention is one product per prompt instead of one per row.
    """
    n_layers = view.dims.n_layers
    layers = layer.tolist()
    counts = [sum(1 for x in layers if x <= at) for at in range(n_layers + 1)]  # slots joined by each layer
    final: list[torch.Tensor] = []

    def joined(at: int, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's input [prompt, slots so far, d_model]."""
        before, now = (counts[at - 1] if at > 0 else 0), counts[at]
        if now == 0:  # no slot yet: the token itself stands in, the layers need a position
            return hidden[:, :1]
        carried = hidden if before > 0 else hidden[:, :0]
        return torch.cat([carried, resid[:, before:now].to(hidden.device, hidden.dtype)], dim=1)

    def block_hook(at: int) -> Callable[..., Any]:
        def fn(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
            hidden = joined(at, args[0] if args else kwargs["hidden_states"])
            widen = _Slots(int(hidden.shape[1]))
            if args:
                out = (hidden, *widen(args[1:])), widen(kwargs)
            else:
                out = args, {**widen(kwargs), "hidden_states": hidden}
            if widen.masks == 0 and widen.n > 1:
                raise SpecError(
                    "slots need the model's explicit attention mask, which this attention implementation does not "
                    "pass to its layers; load the model with attn_implementation='eager'"
                )
            return out

        return fn

    def final_hook(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        final.append(joined(n_layers, args[0]))
        return (final[-1], *args[1:])

    _run_joined(view, block_hook, final_hook, input_ids, None, prefix)
    return final[-1]


def _run_joined(
    view: ModelView,
    block_hook: Callable[[int], Callable[..., Any]],
    final_hook: Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    prefix: Cache | None,
) -> None:
    """The model's own forward with `block_hook(layer)` before each decoder layer and `final_hook` before the
    final norm."""
    device = view.o_proj(0).weight.device
    inputs: dict[str, Any] = {"input_ids": input_ids.to(device), "use_cache": prefix is not None}
    if attention_mask is not None:
        inputs["attention_mask"] = attention_mask.to(device)
    if prefix is not None:
        inputs[cache_kwarg(view.model.base_model)] = prefix
    blocks = [(view.blocks[layer], block_hook(layer)) for layer in range(view.dims.n_layers)]
    with hooks(pre=[(view.final_norm, final_hook)], pre_kwargs=blocks):
        view.model.base_model(**inputs)


class _Slots:
    """Widens a decoder layer's arguments for one decoding step from one position to `n` slots: the attention
    mask [prompt, 1, 1, keys] becomes [prompt, 1, n, keys - 1 + n] (the prefix as the token saw it, then each
    slot itself), the cache `_SlotCache`; position embeddings of the one position broadcast over the slots."""

    def __init__(self, n: int) -> None:
        self.n, self.masks = n, 0

    def __call__(self, value: Any) -> Any:
        if isinstance(value, Cache):
            return _SlotCache(value)
        if isinstance(value, torch.Tensor) and value.dim() == 4 and value.shape[-2] == 1:
            self.masks += 1
            return self.mask(value)
        if isinstance(value, tuple | list):
            return type(value)(self(v) for v in value)
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        return value

    def mask(self, mask: torch.Tensor) -> torch.Tensor:
        """[prompt, 1, 1, keys] -> [prompt, 1, n, keys - 1 + n], boolean (True: seen) or additive (0: seen)."""
        prefix = mask[..., :-1].expand(*mask.shape[:2], self.n, mask.shape[-1] - 1)
        eye = torch.eye(self.n, dtype=torch.bool, device=mask.device)
        if mask.dtype == torch.bool:
            own = eye & mask[..., -1:]
        else:
            own = torch.where(eye, mask[..., -1:], torch.finfo(mask.dtype).min)
        return torch.cat([prefix, own.expand(mask.shape[0], mask.shape[1], self.n, self.n)], dim=-1)


class _SlotCache:
    """The prefix cache as the slots see it: read-only, the prompt's keys followed by the slots' own."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[prompt, kv_head, prefix + slots, d_head] each."""
        kept = self.cache.layers[layer_idx]
        return torch.cat([kept.keys, key_states], dim=-2), torch.cat([kept.values, value_states], dim=-2)


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
