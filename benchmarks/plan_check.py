"""A benchmark's measurement beside `arithmech plan`'s: planned against measured memory, estimated against
measured time.

The benchmarks that run a stage's engine at a real shape (gpu_scan.py, gpu_finetune.py, plan_skeletons.py) plan the
same call with `plan_stage` (the same shape, config and prompt length) and print both, so that whoever first runs them
on a GPU learns at once how good the plan was. Memory compares like with like: the plan's peak less the weights
against the allocator's peak of live tensors above what was live before the call (measured_peak.py), so the weights,
loaded before, are in neither. Time is the plan's roofline estimate for a device profile (plan/devices.py): the
profile named for the GPU the script runs on when it is one of the presets, `measured` (a probe of this machine) on
a CPU; it is labelled an estimate, never a measurement.
"""

from __future__ import annotations

from typing import Any

from arithmech.plan.devices import PROFILES
from arithmech.plan.sizes import format_size

GPU_PROFILES = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("4090", "rtx4090"))
"""A substring of torch.cuda.get_device_name -> the profile (an A100's by its memory, 40 or 80 GB)."""


def profile_for(device: str) -> str:
    """The device profile that describes `device`: the GPU's preset, else `measured` (a CPU probe) on a CPU, else
    h100, said so in the label (`profile_label`)."""
    if not device.startswith("cuda"):
        return "measured"
    import torch

    if not torch.cuda.is_available():
        return "h100"
    name = torch.cuda.get_device_name(device)
    for part, profile in GPU_PROFILES:
        if part in name:
            if profile == "a100":
                total = torch.cuda.get_device_properties(device).total_memory
                return "a100-80" if total > 48 * 2**30 else "a100-40"
            return profile
    return "h100"


def profile_label(profile: str, device: str) -> str:
    """How the estimate's device is named in a printed line."""
    if profile == "measured":
        return "this machine (measured profile)"
    known = PROFILES[profile].note
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available() and not any(p in torch.cuda.get_device_name(device) for p, _ in GPU_PROFILES):
            return f"{known} profile (this GPU, {torch.cuda.get_device_name(device)}, has none of its own)"
    return f"{known} profile"


def planned_activations(stage_plan: Any, loaded_bytes: int, layout: str = "single") -> int:
    """A stage plan's peak less `loaded_bytes`, what was allocated before the measured call (the model's weights,
    and a trainable delta made before it): what a measurement above that is compared with. Not the plan's own
    weights part, which counts what the call makes beside them (precise SFT's deltas and anchors, LoRA's adapters)."""
    return int(stage_plan.memory[layout].peak - loaded_bytes)


def side_by_side(planned_bytes: int, measured_bytes: int, estimated_s: float | None, measured_s: float,
                 profile: str) -> str:  # fmt: skip
    """`memory planned 1.20 GiB, measured 1.10 GiB (planned / measured 1.09); time estimated ~2.0 s on ..., measured
    2.31 s` (tensors above the weights; the estimate labelled as one)."""
    ratio = f"{planned_bytes / measured_bytes:.2f}" if measured_bytes > 0 else "n/a"
    memory = (f"memory above the weights: planned {format_size(planned_bytes)}, measured {format_size(measured_bytes)} "
              f"(planned / measured {ratio})")  # fmt: skip
    if estimated_s is None:
        return f"{memory}; time: not estimated, measured {measured_s:.2f} s"
    return f"{memory}; time: estimated ~{estimated_s:.2f} s ({profile}), measured {measured_s:.2f} s"
