"""Best-of-n time of a call, synchronised with the GPU where there is one: wall time, and the process's CPU time
(all its threads), which other processes on a shared machine disturb much less."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def best_times(fn: Callable[[], T], repeats: int) -> tuple[T, float, float]:
    """The result of `fn` and its best wall time and best CPU time over `repeats` runs (at least one)."""
    wall, cpu, result = float("inf"), float("inf"), None
    for _ in range(max(1, repeats)):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall, cpu = min(wall, time.perf_counter() - start), min(cpu, time.process_time() - start_cpu)
    assert result is not None
    return result, wall, cpu


def best_time(fn: Callable[[], T], repeats: int) -> tuple[T, float]:
    """The result of `fn` and its best wall time over `repeats` runs (at least one)."""
    result, wall, _ = best_times(fn, repeats)
    return result, wall
