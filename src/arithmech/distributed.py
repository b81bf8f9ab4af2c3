"""Sharding a scan over the processes of `accelerate launch` (or `torchrun`): split prompts, gather results.

Background
    Path patching, knockout and mediation treat each prompt on its own, so a scan splits over processes
    without changing a number: every process builds the same prompt set (generation, filtering and
    mean-ablation sources are computed on the whole set in every process), scans its contiguous slice, and
    the per-prompt results are gathered in rank order. Every process then holds what one process would have
    computed; only rank 0 (`is_main`) writes the run folder, and `barrier` keeps the others from reading it
    before it is complete.

Split, for n items over W processes (rank r):
    lo(r) = unit * floor(r * ceil(n / unit) / W),  hi(r) = min(lo(r + 1), n)
    With `unit` = the scan's chunk size, shard boundaries fall on chunk boundaries, so every chunk holds the
    same prompts as in one process and the numbers are bit-identical. A shard may be empty (n < W).

One process (no WORLD_SIZE > 1 in the environment): every function is a no-op and accelerate is never imported.
Under a launch, accelerate's `PartialState` sets up torch.distributed (gloo on CPU, NCCL on GPUs) on first use,
with a long timeout (`WAIT_TIMEOUT`): in `arithmech run`, a stage that is not sharded runs on rank 0 while the
others wait at a barrier, and on a 7B model one (evaluate, neurons) can take longer than torch's default.

Usage
    $ accelerate launch --num_processes 4 -m arithmech.cli identify --device cuda ...
    >>> lo, hi = shard_bounds(len(batch), unit=batch_size)
    >>> mine = scan(batch.select(slice(lo, hi)))           # [component, hi - lo]
    >>> everything = gather(mine, dim=1)                   # [component, n], rank order
    >>> if is_main(): write_outputs(everything)
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from arithmech.errors import ConfigError

T = TypeVar("T")
WAIT_TIMEOUT = datetime.timedelta(hours=48)
"""How long a process may wait at a barrier or collective before torch.distributed gives up (default: 10-30 min)."""
_WORLD_ENV = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_processes() -> int:
    """How many processes the launcher started, read from the environment (1 when not launched)."""
    for name in _WORLD_ENV:
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 1


@functools.cache
def _state() -> Any:
    """accelerate's PartialState, created once; CPU processes when CUDA is absent or the launch asked for CPU."""
    import torch
    from accelerate import PartialState

    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or not torch.cuda.is_available()
    state = PartialState(cpu=cpu, timeout=WAIT_TIMEOUT)
    if state.num_processes != launched_processes():
        raise ConfigError(
            f"the launcher started {launched_processes()} processes but accelerate joined {state.num_processes}; "
            "launch with `accelerate launch --multi_gpu --num_processes N` or `torchrun --nproc_per_node N`"
        )
    return state


def world_size() -> int:
    """Number of processes sharing the scan."""
    return 1 if launched_processes() <= 1 else int(_state().num_processes)


def rank() -> int:
    """This process's index, 0 .. world_size() - 1."""
    return 0 if launched_processes() <= 1 else int(_state().process_index)


def is_main() -> bool:
    """Whether this process writes files and shows progress (rank 0)."""
    return rank() == 0


def shard_bounds(n: int, unit: int = 1) -> tuple[int, int]:
    """This process's contiguous slice [lo, hi) of n items, cut at multiples of `unit` (see module docstring)."""
    if unit < 1:
        raise ConfigError(f"unit must be at least 1 (got {unit})")
    world, me = world_size(), rank()
    chunks = -(-n // unit)  # ceil(n / unit)
    lo = unit * (me * chunks // world)
    hi = unit * ((me + 1) * chunks // world)
    return min(lo, n), min(hi, n)


def shard(items: Sequence[T], unit: int = 1) -> Sequence[T]:
    """This process's contiguous slice of `items` (all of them in one process)."""
    lo, hi = shard_bounds(len(items), unit)
    return items[lo:hi]


def gather(value: Any, dim: int = 0) -> Any:
    """Every process's `value`, in rank order: lists are concatenated, tensors concatenated along `dim`.

    Tensors travel through the CPU, so a receiving process never needs another process's device. Every
    process must call this, with an empty list or tensor when its shard is empty.
    """
    if launched_processes() <= 1:
        return value
    import torch
    from accelerate.utils import gather_object

    _state()
    if isinstance(value, torch.Tensor):
        return torch.cat(gather_object([value.detach().cpu()]), dim=dim)
    if isinstance(value, list | tuple):
        return gather_object(list(value))
    raise TypeError(f"gather takes a list or a tensor, not {type(value).__name__}")


def barrier() -> None:
    """Wait until every process gets here (e.g. until rank 0 has written a folder the others will read)."""
    if launched_processes() > 1:
        _state().wait_for_everyone()


def check_same(what: str, *parts: Any) -> None:
    """Raise unless every process passes the same `parts` (tensors or JSON-like values): the shared inputs of
    a sharded scan (prompts, ranking) must be identical, or the gathered results would not fit together."""
    if launched_processes() <= 1:
        return
    import torch

    digest = hashlib.sha256()
    for part in parts:
        data = part.detach().cpu().contiguous().numpy().tobytes() if isinstance(part, torch.Tensor) else repr(part)
        digest.update(data if isinstance(data, bytes) else data.encode())
    digests = gather([digest.hexdigest()])
    if len(set(digests)) > 1:
        raise ConfigError(
            f"the processes built different {what} (digests {', '.join(d[:8] for d in digests)}); "
            "give every process the same model, data and settings"
        )


def local_device(load: Callable[[], T]) -> Callable[[], T]:
    """Under a multi-process GPU launch, load each process's model onto its own GPU (cuda:LOCAL_RANK).

    `load` is the `functools.partial(load_handle, ...)` of `cli.options.model_options`. With `--device auto`
    (device_map over all GPUs) each process also gets one GPU, since the processes would otherwise share every
    GPU; a model too big for one GPU runs as one process with `--device auto`.
    """
    local = os.environ.get("LOCAL_RANK")
    keywords = getattr(load, "keywords", {})
    if local is None or launched_processes() <= 1 or keywords.get("device") not in ("cuda", "auto"):
        return load
    func = load.func  # type: ignore[attr-defined]
    return lambda: func(**{**keywords, "device": f"cuda:{local}"})
