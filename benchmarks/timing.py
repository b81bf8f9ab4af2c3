"""Best-of-n wall time of a call, synchronised with the GPU where there is one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def best_time(fn: Callable[[], T], repeats: int) -> tuple[T, float]:
    """The result of `fn` and its best wall time over `repeats` runs (at least one)."""
    best, result = float("inf"), None
    for _ in range(max(1, repeats)):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return result, best
