"""A call's peak memory, measured as the plan counts it, and the process's resident memory beside it.

Tensors (what `arithmech plan` plans, and what is compared with it): the allocator's peak of live tensor bytes
during the call, above what was live before it (the weights, loaded earlier, are not in it).
    CUDA  torch.cuda.max_memory_allocated after reset_peak_memory_stats, less memory_allocated at the start
    CPU   the CPU allocator's own records of every allocation and free, summed in time order
          (tests/allocation_peak.py, torch.profiler with profile_memory=True), the same quantity
Process (CPU only, shown beside, never compared): the peak resident set size during the call above the resident
set at its start, from the kernel's high-water mark (VmHWM, reset through /proc/self/clear_refs). It adds what no
plan of tensors predicts: freed pages the C allocator keeps, libraries, the profiler's own records.

`measure` also times the call (wall seconds, the profiler's overhead included on a CPU) and records the widest
input the model embedded, the prompt length a plan of the call must assume.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from allocation_peak import peak_allocated  # noqa: E402
from arithmech.models.hooks import hooks  # noqa: E402

T = TypeVar("T")
TENSORS_CPU = "CPU allocator's peak of live tensors above the start (torch.profiler memory records)"
TENSORS_CUDA = "CUDA allocator's peak of live tensors above the start (torch.cuda.max_memory_allocated)"
PROCESS_RSS = "process resident set's peak above the start (VmHWM after /proc/self/clear_refs)"


@dataclass(frozen=True)
class Measured:
    """What one call took: tensor bytes (compared with a plan), resident bytes (CPU, shown), seconds, widest input."""

    tensor_bytes: int
    rss_bytes: int | None
    seconds: float
    widest_tokens: int
    how: str
    widths: tuple[int, ...] = ()
    """The width of every input the model embedded, in call order (fine-tuning: one per micro-batch)."""


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_rss_peak() -> int | None:
    """Reset the kernel's resident high-water mark; the resident bytes now, or None where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    rss = _status_kib("VmRSS")
    return None if rss is None else rss * 1024


def measure(fn: Callable[[], T], model: Any, device: str = "cpu") -> tuple[T, Measured]:
    """Run `fn` once and measure it (module docstring)."""
    widths: list[int] = []

    def embedded(_module: Any, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 1:
            widths.append(int(args[0].shape[-1]))

    results: list[T] = []
    with hooks(pre=[(model.get_input_embeddings(), embedded)]):
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            start_bytes = torch.cuda.memory_allocated(device)
            start = time.perf_counter()
            results.append(fn())
            torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            tensors = torch.cuda.max_memory_allocated(device) - start_bytes
            return results[0], Measured(tensors, None, seconds, max(widths, default=0), TENSORS_CUDA, tuple(widths))
        rss_start = _reset_rss_peak()
        start = time.perf_counter()
        tensors = peak_allocated(lambda: results.append(fn()))
        seconds = time.perf_counter() - start
        peak_kib = _status_kib("VmHWM")
        rss = None if rss_start is None or peak_kib is None else max(0, peak_kib * 1024 - rss_start)
        how = f"{TENSORS_CPU}; {PROCESS_RSS}"
        return results[0], Measured(tensors, rss, seconds, max(widths, default=0), how, tuple(widths))
