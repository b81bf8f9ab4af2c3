"""Patch one position's residual at one layer, many variants at once, and read a logit difference.

Background
    The numbers stage judges a reading of the numbers causally (Kantamneni & Tegmark 2025, sec. 4.2): the
    residual entering layer l at position p of a base run is replaced by a new vector (the clean run's
    activation, or only its part in a fit's subspace), everything after is recomputed, and the logit
    difference LD = logit[good] - logit[bad] is read at the prompt's read position. Positions before p and
    layers below l are the base run's own, so a variant runs only layers l.. on positions p.. with the base
    run's keys and values of the positions before (`models/from_layer.run_from_layers`).

Formula, per row (prompt i, layer l, vector x [d_model])
    x_l[i, p] <- x;  x_{l+1..L} recomputed on positions p..;  LD = W_U[good_i] . norm(x_L[i, read_i])
                                                                   - W_U[bad_i] . norm(x_L[i, read_i])
    (logits read in float32 by `ModelView.answer_logits`, with the model's bias and soft-cap).

Cost
    One base pass per prompt set (`base_run`: the residual entering every layer and a full key/value cache),
    then per row (L - l) layers on S - p positions: `row_cost` counts token-layers, and a forward pass of a
    prompt is L x S of them.

A head's output
    Setting one head's output at p (the Clock's head classification) changes only the residual entering l + 1
    at p: `after_head` recomputes the rest of layer l there (its MLP) and the row joins at l + 1.

Usage
    >>> base, final = base_run(view, ids, mask)                         # ids, mask [prompt, pos]
    >>> ld = patch_rows(view, base, pos, prompt, layer, vectors, read, good, bad)   # [row]
    >>> x = after_head(view, l, resid_pre, attn_out, new_head_out - head_out)      # then patch_rows at l + 1

References: Kantamneni & Tegmark, ICML 2025 (arXiv 2502.00873) sec. 4.2; `patching/mediation.py` (the same
join-at-a-layer engine for component interventions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from arithmech.models.from_layer import JoiningRows, run_from_layers
from arithmech.models.hooks import hooks
from arithmech.models.shared_prefix import full_cache, prefix_cache
from arithmech.models.view import ModelView, cache_kwarg
from arithmech.patching.path import block_output


@dataclass(frozen=True)
class BaseRun:
    """One forward pass of a prompt set kept for rows that change one position: its tokens, the residual
    entering every layer and the keys/values of every position."""

    ids: torch.Tensor  # [prompt, pos] long, right-padded
    mask: torch.Tensor  # [prompt, pos] long, 1 = real token
    resid: torch.Tensor  # [layer + 1, prompt, pos, d_model]: entering each decoder layer, then the final norm
    cache: Any  # full_cache of the run


@torch.no_grad()
def base_run(view: ModelView, ids: torch.Tensor, mask: torch.Tensor) -> tuple[BaseRun, torch.Tensor]:
    """(the kept run, the residual entering the final norm [prompt, pos, d_model])."""
    n_layers = view.dims.n_layers
    seen: dict[int, torch.Tensor] = {}

    def save(layer: int) -> Callable[..., None]:
        return lambda _module, args: seen.__setitem__(layer, args[0].detach())

    modules = [(view.attn_norm(layer) if layer < n_layers else view.final_norm, save(layer))
               for layer in range(n_layers + 1)]  # fmt: skip
    device = view.o_proj(0).weight.device
    cache = full_cache()
    with hooks(pre=modules):
        view.model.base_model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=True,
                              **{cache_kwarg(view.model.base_model): cache})  # fmt: skip
    resid = torch.stack([seen[layer] for layer in range(n_layers + 1)])  # [layer + 1, prompt, pos, d_model]
    return BaseRun(ids, mask, resid, cache), seen[n_layers]


def logit_diff(view: ModelView, final: torch.Tensor, good: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """LD [row] = logit[good] - logit[bad] of final residuals [row, d_model] (float32 readout)."""
    return view.answer_logits(final, good) - view.answer_logits(final, bad)


@torch.no_grad()
def patch_rows(
    view: ModelView,
    base: BaseRun,
    pos: int,
    prompt: torch.Tensor,
    layer: torch.Tensor,
    vectors: torch.Tensor,
    read: torch.Tensor,
    good: torch.Tensor,
    bad: torch.Tensor,
    max_rows: int = 256,
) -> torch.Tensor:
    """LD [row] of the base run with the residual entering layer[r] at position `pos` of prompt[r] set to
    vectors[r] ([row, d_model]); layer n_layers is the final norm's input. read [prompt] the position read,
    good/bad [prompt] the two tokens."""
    order = torch.argsort(layer, stable=True)
    out = torch.empty(len(layer), dtype=torch.float32)
    n_prompts = int(base.ids.shape[0])
    ids = base.ids[:, pos:]  # [prompt, pos..]
    for start in range(0, len(order), max_rows):
        rows = order[start : start + max_rows]
        p, lay = prompt[rows], layer[rows]
        resid = base.resid[lay, p, pos:].clone()  # [row, pos.., d_model]
        resid[:, 0] = vectors[rows].to(resid.dtype)
        prefix = prefix_cache(view, base.cache, torch.arange(n_prompts), pos) if pos > 0 else None
        final = run_from_layers(view, JoiningRows(p, lay, resid), ids, base.mask, prefix)  # [row, pos.., d_model]
        at = final[torch.arange(len(rows)), (read[p] - pos).to(final.device)]  # [row, d_model]
        out[rows] = logit_diff(view, at, good[p], bad[p]).float().cpu()
    return out


def after_head(view: ModelView, layer: int, resid_pre: torch.Tensor, attn_out: torch.Tensor,
               delta: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The residual entering layer + 1 [row, d_model] at one position when the output of one head of `layer` there
    changes by delta [row, d_model] (its new output less its own), from the run's residual entering the layer
    resid_pre and its attention output attn_out ([row, d_model], before any post-attention norm) at that
    position: a head patch is a residual patch one layer up (`patch_rows` at layer + 1), since the positions
    after it read the layer's keys and values, which the head's output does not change."""
    attn = view.attn_resid(layer, attn_out + delta.to(attn_out.dtype))
    return block_output(view, layer, resid_pre, attn)


def row_cost(n_layers: int, layer: torch.Tensor, positions: int) -> int:
    """Token-layers run by rows joining at `layer` [row] on `positions` positions each."""
    return int((n_layers - layer).sum()) * positions
