"""Scoped hooks: every hook arithmech adds is registered inside a context manager and removed in `finally`,
so no hook outlives the call that added it, also when that call raises. All stages go through here, so
"no hook leaks" is one test (see `count_hooks`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

PreHook = Callable[[nn.Module, tuple[Any, ...]], Any]
PostHook = Callable[[nn.Module, tuple[Any, ...], Any], Any]
KwargsPreHook = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], Any]


@contextmanager
def hooks(
    pre: Sequence[tuple[nn.Module, PreHook]] = (),
    post: Sequence[tuple[nn.Module, PostHook]] = (),
    pre_kwargs: Sequence[tuple[nn.Module, KwargsPreHook]] = (),
) -> Iterator[None]:
    """Register forward pre-hooks and forward hooks for the duration of the block.

    A pre-hook may return new positional args (a tuple) or None; a post-hook may return a new output or None.
    A `pre_kwargs` hook also sees the keyword arguments, `fn(module, args, kwargs)`, and may return a new
    `(args, kwargs)` pair or None.
    """
    handles: list[torch.utils.hooks.RemovableHandle] = []
    try:
        for module, fn in pre:
            handles.append(module.register_forward_pre_hook(fn))
        for module, fn in pre_kwargs:
            handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))
        for module, fn in post:
            handles.append(module.register_forward_hook(fn))
        yield
    finally:
        for handle in handles:
            handle.remove()


def count_hooks(model: nn.Module) -> int:
    """Number of forward (pre-)hooks on any submodule of `model`; zero outside a `hooks` block."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def first_tensor(output: Any) -> torch.Tensor:
    """The tensor of a module output that is a tensor or a tuple starting with one."""
    return output[0] if isinstance(output, tuple) else output
