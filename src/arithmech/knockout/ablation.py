"""Ablation of heads and MLPs: replace a component's output and keep everything else running.

Background
    Zhang et al. (2024, section 4.1) validate key heads by mean ablation: a knocked-out head's output is
    replaced by its mean over the counterfactual set X_c, so the head still writes "something typical" but
    carries no information about the operator. Yu & Ananiadou zero the output; Stolfo et al. resample it
    from another prompt. All three are one operation here: out[rows, pos, component] = source[rows, pos].

Sites (the same as path patching): a head's output is its slice of the o_proj input [batch, pos, head*d_head]
(its contribution is that slice times its block of W_O), an MLP's is its module output [batch, pos, d_model].

Sources, per prompt and position (METHODS.md sec. 3):
    mean      mean over the counterfactual prompts of the same group (same template and length, so
              positions are aligned); with `end_only`, the mean of the END value over all counterfactual
              prompts, placed at END and nothing else replaced.
    zero      zeros.
    resample  the reference-run value of another prompt of the same group (a seeded permutation), so the
              operands differ but the template does not.

Usage
    >>> sources = ablation_sources(view, batch, "mean", groups)
    >>> with ablate(view, [Component(14, 2), Component(20)], sources):
    ...     logits = view.model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask).logits

`ablate` registers hooks only for ablated components, so ablating nothing leaves the logits bit-identical.
Batched sweeps over many configurations use `ConfigMasks` (see `knockout/batched.py`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch

from arithmech.errors import ConfigError
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch

AblationMode = Literal["mean", "zero", "resample"]
ABLATION_MODES: tuple[str, ...] = ("mean", "zero", "resample")


@dataclass
class AblationSources:
    """Replacement values for every layer, one row per prompt of the batch they were made for."""

    z: list[torch.Tensor]
    """Per layer [batch, pos, head * d_head]: o_proj input to put in place of ablated heads."""
    mlp: list[torch.Tensor]
    """Per layer [batch, pos, d_model]: MLP output to put in place of ablated MLPs."""
    positions: torch.Tensor
    """[batch, pos] bool: where ablation applies (all real tokens, or END only)."""


@torch.no_grad()
def run_activations(
    view: ModelView, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """o_proj inputs and MLP outputs of every layer at every position: ([batch, pos, H*dh], [batch, pos, d])."""
    n = view.dims.n_layers
    z: list[Any] = [None] * n
    mlp: list[Any] = [None] * n

    def save_z(layer: int) -> Any:
        def fn(_m: Any, args: tuple[Any, ...]) -> None:
            z[layer] = args[0].detach()

        return fn

    def save_mlp(layer: int) -> Any:
        def fn(_m: Any, _a: Any, out: Any) -> None:
            mlp[layer] = first_tensor(out).detach()

        return fn

    device = view.o_proj(0).weight.device
    with hooks(
        pre=[(view.o_proj(layer), save_z(layer)) for layer in range(n)],
        post=[(view.mlp(layer), save_mlp(layer)) for layer in range(n)],
    ):
        view.model.base_model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
    return z, mlp


def alignment_groups(keys: list[str | None], lengths: torch.Tensor) -> list[int]:
    """Group index per prompt: same template key and same token length means positions are aligned."""
    index: dict[tuple[str | None, int], int] = {}
    return [index.setdefault((key, int(n)), len(index)) for key, n in zip(keys, lengths.tolist(), strict=True)]


def _group_mean(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Replace each row by the mean of its group's rows: [batch, ...] -> [batch, ...]."""
    out = torch.empty_like(values)
    for g in groups.unique():
        rows = groups == g
        out[rows] = values[rows].mean(dim=0, keepdim=True)
    return out


def _derangement(groups: list[int], seed: int) -> list[int]:
    """For each prompt, another prompt of its group (itself only if it is alone)."""
    rng = random.Random(seed)
    source = list(range(len(groups)))
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    for rows in members.values():
        if len(rows) > 1:
            shift = rng.randrange(1, len(rows))
            order = rows[:]
            rng.shuffle(order)
            for j, row in enumerate(order):
                source[row] = order[(j + shift) % len(order)]
    return source


@torch.no_grad()
def ablation_sources(
    view: ModelView,
    batch: PatchingBatch,
    mode: str,
    groups: list[int],
    end_only: bool = False,
    seed: int = 0,
) -> AblationSources:
    """Replacement values for `batch` (its reference prompts), from its counterfactual or reference runs."""
    if mode not in ABLATION_MODES:
        raise ConfigError(f"ablation {mode!r} is not one of {', '.join(ABLATION_MODES)}")
    rows = torch.arange(len(batch))
    positions = batch.ref_mask.bool()
    if end_only:
        positions = torch.zeros_like(positions)
        positions[rows, batch.end] = True
    if mode == "zero":
        shapes = _shapes(view, batch)
        z = [torch.zeros(shapes[0]) for _ in range(view.dims.n_layers)]
        mlp = [torch.zeros(shapes[1]) for _ in range(view.dims.n_layers)]
        return AblationSources(z, mlp, positions)
    if mode == "resample":
        z, mlp = run_activations(view, batch.ref_ids, batch.ref_mask)
        source = torch.tensor(_derangement(groups, seed))
        return AblationSources([t[source] for t in z], [t[source] for t in mlp], positions)
    z, mlp = run_activations(view, batch.cf_ids, batch.cf_mask)
    if end_only:
        z = [_end_mean(t, batch.end) for t in z]
        mlp = [_end_mean(t, batch.end) for t in mlp]
    else:
        group_ids = torch.tensor(groups)
        z = [_group_mean(t, group_ids.to(t.device)) for t in z]
        mlp = [_group_mean(t, group_ids.to(t.device)) for t in mlp]
    return AblationSources(z, mlp, positions)


def _shapes(view: ModelView, batch: PatchingBatch) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n, width = batch.ref_ids.shape
    d = view.dims
    return (n, width, d.n_heads * d.d_head), (n, width, d.d_model)


def _end_mean(values: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """[batch, pos, ...] -> the same shape holding the mean END value at every prompt's END."""
    rows = torch.arange(values.shape[0], device=values.device)
    mean = values[rows, end.to(values.device)].mean(dim=0)
    out = torch.zeros_like(values)
    out[rows, end.to(values.device)] = mean
    return out


@contextmanager
def ablate(view: ModelView, components: list[Component], sources: AblationSources) -> Iterator[None]:
    """Knock out `components` during the block, for a forward pass over the batch `sources` was made for."""
    head_masks, mlp_masks = config_masks(view, [components])
    n_prompts = sources.positions.shape[0]
    config = torch.zeros(n_prompts, dtype=torch.long)  # every row runs the one configuration
    with hooks(**ablation_hooks(view, head_masks, mlp_masks, sources, config, torch.arange(n_prompts))):
        yield


def config_masks(view: ModelView, configs: list[list[Component]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean masks ([config, layer, head], [config, layer]) of what each configuration ablates."""
    d = view.dims
    heads = torch.zeros(len(configs), d.n_layers, d.n_heads, dtype=torch.bool)
    mlps = torch.zeros(len(configs), d.n_layers, dtype=torch.bool)
    for i, config in enumerate(configs):
        for c in config:
            if c.head is None:
                mlps[i, c.layer] = True
            else:
                heads[i, c.layer, c.head] = True
    return heads, mlps


def ablation_hooks(
    view: ModelView,
    head_masks: torch.Tensor,
    mlp_masks: torch.Tensor,
    sources: AblationSources,
    config: torch.Tensor,
    prompt: torch.Tensor,
) -> dict[str, list[tuple[Any, Any]]]:
    """Hooks for rows (config[i], prompt[i]); a layer gets a hook only if some row ablates something in it."""
    pre, post = [], []
    for layer in range(view.dims.n_layers):
        row_heads = head_masks[config, layer]  # [row, head]
        if row_heads.any():
            pre.append((view.o_proj(layer), _heads_hook(view, row_heads, sources, layer, prompt)))
        row_mlp = mlp_masks[config, layer]  # [row]
        if row_mlp.any():
            post.append((view.mlp(layer), _mlp_hook(row_mlp, sources, layer, prompt)))
    return {"pre": pre, "post": post}


def _heads_hook(
    view: ModelView, row_heads: torch.Tensor, sources: AblationSources, layer: int, prompt: torch.Tensor
) -> Any:
    def fn(_m: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        z = args[0]  # [row, pos, head * d_head]
        width = z.shape[1]
        where = sources.positions[prompt, :width, None, None] & row_heads[:, None, :, None]  # [row, pos, head, 1]
        source = view.split_heads(sources.z[layer][prompt, :width].to(z.device, z.dtype))
        new = torch.where(where.to(z.device), source, view.split_heads(z))
        return (new.reshape(z.shape), *args[1:])

    return fn


def _mlp_hook(row_mlp: torch.Tensor, sources: AblationSources, layer: int, prompt: torch.Tensor) -> Any:
    def fn(_m: Any, _a: Any, output: Any) -> Any:
        out = first_tensor(output)  # [row, pos, d_model]
        width = out.shape[1]
        where = sources.positions[prompt, :width, None] & row_mlp[:, None, None]  # [row, pos, 1]
        new = torch.where(where.to(out.device), sources.mlp[layer][prompt, :width].to(out.device, out.dtype), out)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return fn
