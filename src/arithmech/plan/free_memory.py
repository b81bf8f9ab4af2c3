"""How much memory a device has free: the budget of a stage run without --max-memory.

CUDA: what `torch.cuda.mem_get_info` reports free on the device (other processes' use already taken out); under a
multi-process launch each process measures its own GPU (cuda:LOCAL_RANK, where `distributed.local_device` loads
it), and with --device auto the smallest free memory of the visible GPUs (each holds a share of the layers). CPU:
the memory the system has available (psutil when it is installed, else MemAvailable of /proc/meminfo on Linux).
Where neither can say (another OS without psutil, another accelerator), there is no default budget and a stage
keeps the sizes it was given.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

from arithmech.distributed import launched_processes

MEMINFO = Path("/proc/meminfo")


def free_memory(device: str) -> tuple[int, str] | None:
    """(bytes free on `device`, where they were read, as a phrase), or None when this machine cannot say."""
    if device == "cpu":
        return available_system_memory()
    import torch

    if not torch.cuda.is_available() or not (device == "auto" or device.startswith("cuda")):
        return available_system_memory() if device == "auto" else None  # auto without GPUs loads on the CPU
    local = os.environ.get("LOCAL_RANK")
    if local is not None and launched_processes() > 1 and device in ("cuda", "auto"):
        device = f"cuda:{local}"
    if device == "auto":
        free = [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]
        return min(free), f"the smallest free memory of the {len(free)} GPUs"
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    return torch.cuda.mem_get_info(index)[0], f"the free memory of cuda:{index}"


def gpu_count() -> int:
    """GPUs --device auto spreads a model over (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def available_system_memory() -> tuple[int, str] | None:
    """The memory the system can give a new allocation without swapping, or None."""
    if importlib.util.find_spec("psutil") is not None:
        psutil = importlib.import_module("psutil")
        return int(psutil.virtual_memory().available), "the available system memory"
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "the available system memory"
    except (OSError, ValueError, IndexError):
        pass
    return None
