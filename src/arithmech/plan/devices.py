"""Device profiles: peak arithmetic and memory bandwidth, for turning work into an estimated time.

The presets are the vendors' data-sheet peaks (dense, no sparsity): tensor-core bfloat16/float16, and float32
without TF32 (torch's default for matmuls). An estimate assumes a share of each peak is reached
(`MATMUL_EFFICIENCY`, `BANDWIDTH_EFFICIENCY`): a forward pass takes the longer of its arithmetic at that share and
reading its weights once at that share of the bandwidth. `--device-profile measured` times a matmul and a memory
copy on this machine (torch, a second or two) instead of a data sheet.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from arithmech.errors import ConfigError

MATMUL_EFFICIENCY = 0.5
"""Share of peak FLOP/s a forward pass of a decoder reaches (a typical model FLOP utilisation)."""
BANDWIDTH_EFFICIENCY = 0.8
"""Share of peak memory bandwidth a pass streaming the weights reaches."""


@dataclass(frozen=True)
class DeviceProfile:
    """One accelerator (or this machine): peak FLOP/s per dtype, bandwidth and memory, in bytes and seconds."""

    name: str
    flops_16bit: float
    flops_32bit: float
    bandwidth: float
    memory: int | None
    note: str = ""
    kind: str = "gpu"
    """gpu or cpu: what torch's optimizers do differs (AdamW steps every tensor at once with foreach on a GPU)."""

    def flops(self, dtype: str) -> float:
        return self.flops_32bit if dtype == "float32" else self.flops_16bit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("h100", 989e12, 67e12, 3.35e12, 80 * 10**9, "H100 SXM5 80 GB"),
    "h200": DeviceProfile("h200", 989e12, 67e12, 4.8e12, 141 * 10**9, "H200 SXM 141 GB"),
    "a100-80": DeviceProfile("a100-80", 312e12, 19.5e12, 2.039e12, 80 * 10**9, "A100 SXM4 80 GB"),
    "a100-40": DeviceProfile("a100-40", 312e12, 19.5e12, 1.555e12, 40 * 10**9, "A100 SXM4 40 GB"),
    "rtx4090": DeviceProfile("rtx4090", 165e12, 82.6e12, 1.008e12, 24 * 10**9, "GeForce RTX 4090 24 GB"),
}
"""Preset name -> data-sheet profile."""


def device_profile(name: str) -> DeviceProfile:
    """A preset, or `measured` (a probe of this machine); one sentence listing them otherwise."""
    if name == "measured":
        return measure_this_machine()
    found = PROFILES.get(name.lower())
    if found is None:
        raise ConfigError(f"unknown device profile {name!r}; the profiles are {', '.join(PROFILES)} and measured")
    return found


def measure_this_machine(seconds: float = 0.5) -> DeviceProfile:
    """Time float32 matmuls (1024 x 1024) and copies of 64 MiB on the CPU for about `seconds` each; the 16-bit
    peak is taken as the float32 one (CPUs gain little from it)."""
    import torch

    a = torch.randn(1024, 1024)
    flops = _rate(lambda: torch.mm(a, a), 2 * 1024**3, seconds)
    src = torch.empty(16 * 2**20)
    dst = torch.empty_like(src)
    bandwidth = _rate(lambda: dst.copy_(src), 2 * src.numel() * 4, seconds)  # a read and a write
    return DeviceProfile("measured", flops, flops, bandwidth, None, f"this machine (CPU, {torch.get_num_threads()} "
                         "threads), timed now", kind="cpu")  # fmt: skip


def _rate(fn: Any, work: float, seconds: float) -> float:
    fn()
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or runs < 3:
        fn()
        runs += 1
    return work * runs / elapsed
