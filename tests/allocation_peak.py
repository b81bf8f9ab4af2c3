"""The peak of live tensor bytes a computation allocates on the CPU, from the allocator's own records.

torch.profiler with `profile_memory=True` records every allocation and free of the CPU allocator (c10's
reportMemoryUsage: sizes in bytes, timestamps), tensors that autograd keeps for the backward included, which a
Python-level count of tensor objects would miss. Summed in time order, their running total's maximum is the peak
of bytes allocated inside the block above what was live before it (the weights, already loaded, are not in it).
This is what `torch.cuda.max_memory_allocated` reports on a GPU, less the allocator's rounding to blocks; it is
the quantity `arithmech plan` plans. The process's resident set size would add Python, libraries and freed pages
the allocator has not returned, which no plan of tensors can predict.

    >>> peak = peak_allocated(lambda: path_patch(view, batch, "path", batch_size=8))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def peak_allocated(fn: Callable[[], Any]) -> int:
    """Peak bytes of CPU tensors allocated by `fn` (above what was live before it), from the allocator's records."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
    while stack:
        node = stack.pop()
        if node.tag == torch._C._profiler._EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak
