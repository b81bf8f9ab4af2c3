"""Hooks that replace a value at each row's last token (END): an input or an output of a module.

Why: an intervention at END only (the END-only knockout of heads and MLPs, the ablation of heuristic neurons)
changes no earlier position, so the engines that run only the positions after a cached start put their
replacement here, written once, with the same rule for every site:

    x[row, end[row], j] <- value[row, j]   where mask[row, j]       (x [row, pos, width], value [row, width])
    x unchanged everywhere else                                      (mask [row, width] or [row, 1], broadcast)

A row whose mask is all False keeps its activations bit-identical. The replacement is a copy: the module's own
tensor is never written in place.

Usage
    >>> with hooks(pre=[(view.down_proj(layer), input_at_end(mask, value, end))]):   # neurons [row, d_mlp]
    ...     view.model.base_model(...)
    >>> with hooks(post=[(view.mlp(layer), output_at_end(mlp_mask[:, None], value, end))]):  # a whole MLP
    ...     view.model.base_model(...)
"""

from __future__ import annotations

from typing import Any

import torch

from arithmech.models.hooks import PostHook, PreHook, first_tensor


def at_end(x: torch.Tensor, mask: torch.Tensor, value: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """A copy of x [row, pos, width] with value [row, width] at each row's `end` where mask [row, width|1]."""
    rows, at = torch.arange(x.shape[0], device=x.device), end.to(x.device)
    new = x.clone()
    new[rows, at] = torch.where(mask.to(x.device), value.to(x.device, x.dtype), x[rows, at])
    return new


def input_at_end(mask: torch.Tensor, value: torch.Tensor, end: torch.Tensor) -> PreHook:
    """A forward pre-hook: the module's first input, replaced at END as `at_end` says."""

    def fn(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (at_end(args[0], mask, value, end), *args[1:])

    return fn


def output_at_end(mask: torch.Tensor, value: torch.Tensor, end: torch.Tensor) -> PostHook:
    """A forward hook: the module's output (a tensor, or the first of a tuple), replaced at END."""

    def fn(_module: Any, _args: Any, output: Any) -> Any:
        new = at_end(first_tensor(output), mask, value, end)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return fn
