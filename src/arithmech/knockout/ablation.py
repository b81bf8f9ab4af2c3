"""Ablation of heads and MLPs: replace a component's output and keep everything else running.

Background
    Zhang et al. (2024, section 4.1) validate key heads by mean ablation: a knocked-out head's output is
    replaced by its mean over the counterfactual set X_c, so the head still writes "something typical" but
    carries no information about the operator. Yu & Ananiadou zero the output; Stolfo et al. resample it
    from another prompt. All three are one operation here: out[rows, pos, component] = source[rows, pos].

Sites (the same as path patching): a head's output is its slice of the o_proj input [batch, pos, head*d_head]
(its contribution is that slice times its block of W_O), an MLP's is its module output [batch, pos, d_model].

Sources (METHODS.md sec. 3), computed on a whole prompt set and then taken for the prompts being scored:
    mean      the mean over the counterfactual prompts of the same group: same template and same token length,
              so positions are aligned. A group must hold at least `min_group_size` prompts (default 4): in a
              smaller group the mean is mostly the prompt's own counterfactual (in a group of one it is
              exactly that, which patches rather than ablates). Prompts of smaller groups fall back to the END
              mean below, at END only. With `end_only`, every prompt gets the END fallback: the mean END value
              over all counterfactual prompts of the set, placed at END and nothing else replaced.
    zero      zeros.
    resample  the reference-run value of another prompt of the same group (a seeded derangement), so the
              operands differ but the template does not. A prompt of a group below `min_group_size` takes the
              END value of another prompt of the whole set, at END only (never its own value).
    The group sizes, the rule and how many prompts fell back are in `AblationSources.summary()`, which the
    stages write to metadata.json.

Storage
    Sources hold one row per distinct replacement value (a group mean, the END mean, the zero row, or a
    prompt's own run for resample) and a row index per prompt, so mean and zero ablation keep memory
    proportional to the number of groups, not of prompts. The means are accumulated over chunks of the set.

Usage
    >>> sources = ablation_sources(view, batch, "mean", groups)
    >>> with ablate(view, [Component(14, 2), Component(20)], sources):
    ...     logits = view.model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask).logits

`ablate` registers hooks only for ablated components, so ablating nothing leaves the logits bit-identical.
Batched sweeps over many configurations use `ConfigMasks` (see `knockout/batched.py`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from arithmech.errors import ConfigError
from arithmech.knockout.modes import ABLATION_MODES, MIN_GROUP_SIZE
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch


@dataclass
class AblationSources:
    """Replacement values: a few distinct source rows per layer, and the row each prompt takes."""

    z: list[torch.Tensor]
    """Per layer [source, pos, head * d_head]: o_proj input to put in place of ablated heads."""
    mlp: list[torch.Tensor]
    """Per layer [source, pos, d_model]: MLP output to put in place of ablated MLPs."""
    row: torch.Tensor
    """[prompt] long: the source row of each prompt."""
    positions: torch.Tensor
    """[prompt, pos] bool: where ablation applies (all real tokens, or END only)."""
    info: dict[str, Any] = field(default_factory=dict)
    """What the values are taken over, the group sizes and the fallbacks (for metadata.json)."""

    def take(self, prompts: Sequence[int] | torch.Tensor | slice) -> AblationSources:
        """The sources of some prompts of the set, in that order (for `batch.select(prompts)`)."""
        index = prompts if isinstance(prompts, slice) else torch.as_tensor(prompts, dtype=torch.long)
        return AblationSources(self.z, self.mlp, self.row[index], self.positions[index], self.info)


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


def alignment_groups(keys: list[str | None], lengths: torch.Tensor) -> list[str]:
    """Group label per prompt: prompts of the same template key and token length have aligned positions."""
    return [f"{key or 'custom'}@{int(n)}" for key, n in zip(keys, lengths.tolist(), strict=True)]


def _derangement(groups: Sequence[Hashable], seed: int) -> list[int]:
    """For each prompt, another prompt of its group (itself only if it is alone)."""
    rng = random.Random(seed)
    source = list(range(len(groups)))
    members: dict[Hashable, list[int]] = {}
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
    groups: Sequence[Hashable],
    end_only: bool = False,
    seed: int = 0,
    min_group_size: int = MIN_GROUP_SIZE,
    batch_size: int = 64,
) -> AblationSources:
    """Replacement values for every prompt of `batch` (the whole set the values are taken over).

    `groups` labels each prompt's alignment group (`alignment_groups`); see the module docstring for the rule.
    Score a sample of the set with `batch.select(chosen)` and `sources.take(chosen)`.
    """
    if mode not in ABLATION_MODES:
        raise ConfigError(f"ablation {mode!r} is not one of {', '.join(ABLATION_MODES)}")
    if min_group_size < 2:
        raise ConfigError(f"min_group_size must be at least 2 (got {min_group_size}): a group of one is no ablation")
    n = len(batch)
    rows = torch.arange(n)
    at_end = torch.zeros_like(batch.ref_mask, dtype=torch.bool)
    at_end[rows, batch.end] = True
    sizes = Counter(groups)
    if mode == "zero":
        small = torch.full((n,), end_only)
    else:
        if n < min_group_size:
            raise ConfigError(
                f"{mode} ablation takes its values from at least {min_group_size} prompts, but the set has {n}; "
                "use more prompts or --ablation zero"
            )
        small = torch.tensor([end_only or sizes[g] < min_group_size for g in groups])
    positions = torch.where(small[:, None], at_end, batch.ref_mask.bool())  # [prompt, pos]
    info: dict[str, Any] = {
        "mode": mode, "end_only": end_only, "min_group_size": min_group_size, "prompts": n,
        "groups": dict(sorted(Counter(str(g) for g in groups).items())), "end_fallback_prompts": int(small.sum()),
    }  # fmt: skip
    if mode == "zero":
        z_shape, mlp_shape = _shapes(view, batch)
        z = [torch.zeros(1, *z_shape) for _ in range(view.dims.n_layers)]
        mlp = [torch.zeros(1, *mlp_shape) for _ in range(view.dims.n_layers)]
        info["over"] = "zeros"
        return AblationSources(z, mlp, torch.zeros(n, dtype=torch.long), positions, info)
    if mode == "resample":
        return _resample_sources(view, batch, groups, small, positions, seed, batch_size, info)
    return _mean_sources(view, batch, groups, small, positions, batch_size, info)


def _mean_sources(
    view: ModelView,
    batch: PatchingBatch,
    groups: Sequence[Hashable],
    small: torch.Tensor,
    positions: torch.Tensor,
    batch_size: int,
    info: dict[str, Any],
) -> AblationSources:
    """Group means of the counterfactual run (rows 0..G-1) and the END mean broadcast over positions (row G)."""
    labels = sorted({g for g, s in zip(groups, small.tolist(), strict=True) if not s}, key=str)
    index = {g: i for i, g in enumerate(labels)}
    row = torch.tensor([len(labels) if s else index[g] for g, s in zip(groups, small.tolist(), strict=True)])
    counts = torch.bincount(row, minlength=len(labels) + 1).clamp(min=1)  # [source]
    sums_z: list[Any] = [None] * view.dims.n_layers
    sums_mlp: list[Any] = [None] * view.dims.n_layers
    end_z: list[Any] = [None] * view.dims.n_layers
    end_mlp: list[Any] = [None] * view.dims.n_layers
    for lo in range(0, len(batch), batch_size):
        chunk = slice(lo, lo + batch_size)
        z, mlp = run_activations(view, batch.cf_ids[chunk], batch.cf_mask[chunk])  # [chunk, pos, ...] per layer
        end = batch.end[chunk]
        for layer in range(view.dims.n_layers):
            for sums, ends, values in ((sums_z, end_z, z[layer]), (sums_mlp, end_mlp, mlp[layer])):
                values = values.float()
                if sums[layer] is None:
                    sums[layer] = values.new_zeros(len(labels) + 1, *values.shape[1:])  # [source, pos, width]
                    ends[layer] = values.new_zeros(values.shape[-1])
                sums[layer].index_add_(0, row[chunk].to(values.device), values)
                ends[layer] += values[torch.arange(len(end)), end.to(values.device)].sum(0)
    for sums, ends in ((sums_z, end_z), (sums_mlp, end_mlp)):
        for layer, total in enumerate(sums):
            total /= counts.to(total.device)[:, None, None]
            total[-1] = ends[layer] / len(batch)  # the END mean over every counterfactual prompt, at every position
    info["over"] = (
        "mean over the set's counterfactual prompts of the same template and token length, per position; "
        "prompts of smaller groups (or all, with end_only): the mean END value over all its counterfactual "
        "prompts, at END only"
    )
    return AblationSources(sums_z, sums_mlp, row, positions, info)


def _resample_sources(
    view: ModelView,
    batch: PatchingBatch,
    groups: Sequence[Hashable],
    small: torch.Tensor,
    positions: torch.Tensor,
    seed: int,
    batch_size: int,
    info: dict[str, Any],
) -> AblationSources:
    """Reference-run values of every prompt (rows 0..n-1) and, for END fallbacks, another prompt's END value."""
    n = len(batch)
    runs = [run_activations(view, batch.ref_ids[lo : lo + batch_size], batch.ref_mask[lo : lo + batch_size])
            for lo in range(0, n, batch_size)]  # fmt: skip
    z = [torch.cat([part[0][layer] for part in runs]) for layer in range(view.dims.n_layers)]
    mlp = [torch.cat([part[1][layer] for part in runs]) for layer in range(view.dims.n_layers)]
    within = _derangement(groups, seed)
    anyone = _derangement([0] * n, seed)  # another prompt of the whole set
    fallback = small.nonzero().flatten().tolist()
    row = torch.tensor(within)
    row[fallback] = n + torch.arange(len(fallback))
    donors = torch.tensor([anyone[i] for i in fallback], dtype=torch.long)
    width = batch.ref_ids.shape[1]
    for values in (z, mlp):
        for layer, tensor in enumerate(values):
            end_values = tensor[donors, batch.end[donors].to(tensor.device)]  # [fallback, width]
            values[layer] = torch.cat([tensor, end_values[:, None].expand(-1, width, -1)])
    info["over"] = (
        "the reference run of another prompt of the same template and token length; prompts of smaller groups "
        "(or all, with end_only): the END value of another prompt of the set, at END only"
    )
    return AblationSources(z, mlp, row, positions, info)


def _shapes(view: ModelView, batch: PatchingBatch) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = batch.ref_ids.shape[1]
    d = view.dims
    return (width, d.n_heads * d.d_head), (width, d.d_model)


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
        source = view.split_heads(sources.z[layer][sources.row[prompt], :width].to(z.device, z.dtype))
        new = torch.where(where.to(z.device), source, view.split_heads(z))
        return (new.reshape(z.shape), *args[1:])

    return fn


def _mlp_hook(row_mlp: torch.Tensor, sources: AblationSources, layer: int, prompt: torch.Tensor) -> Any:
    def fn(_m: Any, _a: Any, output: Any) -> Any:
        out = first_tensor(output)  # [row, pos, d_model]
        width = out.shape[1]
        where = sources.positions[prompt, :width, None] & row_mlp[:, None, None]  # [row, pos, 1]
        source = sources.mlp[layer][sources.row[prompt], :width].to(out.device, out.dtype)
        new = torch.where(where.to(out.device), source, out)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return fn
