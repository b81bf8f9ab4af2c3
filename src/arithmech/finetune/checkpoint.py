"""Training checkpoints: trainable tensors, optimizer, scheduler, RNG and data position, written atomically.

A checkpoint is a folder `<out>/checkpoints/step-NNNNNNNN/` holding
    trainable.safetensors   every parameter that trains (precise: the slice deltas and MLPs; lora: the adapters)
    optimizer.pt            optimizer and scheduler state dicts
    rng-<rank>.pt           each process's torch (and CUDA) and Python RNG states
    state.json              step (= data position: the batch plan is a function of the step), log rows so far,
                            and the run's fingerprint; written last
Tensors are whole even under FSDP2 (gathered from the shards; put back as shards on load). A checkpoint is
written in `.staging-NNNNNNNN/` and renamed into place, so a folder named step-* is always complete; older
checkpoints are then removed. Every process writes its own RNG file, the main process the rest. `--resume`
loads the newest one, after checking that the fingerprint (config, model, data) is the same.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from arithmech.errors import ConfigError
from arithmech.finetune.sharded import load_optimizer_state, load_whole_, optimizer_state, whole
from arithmech.runs import atomic_open, atomic_write_json

CHECKPOINTS = "checkpoints"
_PREFIX = "step-"


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def save_checkpoint(
    accelerator: Any,
    out_dir: Path,
    step: int,
    module: nn.Module,
    trainable: list[tuple[str, nn.Parameter]],
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
) -> Path:
    """Write the checkpoint after `step` optimizer steps; every process must call this.

    `module` is the trained module as prepared (its parameters may be FSDP2 shards: they are gathered whole).
    """
    from safetensors.torch import save as save_tensors

    root = out_dir / CHECKPOINTS
    staging = root / f".staging-{step:08d}"
    final = root / f"{_PREFIX}{step:08d}"
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(rng_state(), staging / f"rng-{accelerator.process_index}.pt")
    tensors = {name: whole(p).detach().cpu().contiguous() for name, p in trainable}
    optimizer_sd = optimizer_state(module, getattr(optimizer, "optimizer", optimizer))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with atomic_open(staging / "trainable.safetensors", "wb") as handle:
            handle.write(save_tensors(tensors))
        with atomic_open(staging / "optimizer.pt", "wb") as handle:
            torch.save({"optimizer": optimizer_sd, "scheduler": scheduler.state_dict()}, handle)
        atomic_write_json(staging / "state.json", {"step": step, **state})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        for old in root.glob(f"{_PREFIX}*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    done = sorted(p for p in (out_dir / CHECKPOINTS).glob(f"{_PREFIX}*") if (p / "state.json").is_file())
    return done[-1] if done else None


def load_checkpoint(
    path: Path,
    module: nn.Module,
    trainable: list[tuple[str, nn.Parameter]],
    optimizer: Any,
    scheduler: Any,
    process_index: int,
    fingerprint: dict[str, Any],
) -> dict[str, Any]:
    """Restore tensors, optimizer, scheduler and this process's RNG; return state.json."""
    from safetensors.torch import load_file

    state = json.loads((path / "state.json").read_text())
    if state.get("fingerprint") != fingerprint:
        changed = sorted(
            k for k in set(fingerprint) | set(state.get("fingerprint", {}))
            if fingerprint.get(k) != state.get("fingerprint", {}).get(k)
        )  # fmt: skip
        raise ConfigError(
            f"the checkpoint in {path} was made with other settings ({', '.join(changed)}); "
            "resume with the same settings, or start afresh in another --out folder"
        )
    tensors = load_file(str(path / "trainable.safetensors"))
    for name, p in trainable:
        load_whole_(p, tensors[name])
    saved = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    load_optimizer_state(module, getattr(optimizer, "optimizer", optimizer), saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    rng_path = path / f"rng-{process_index}.pt"
    if rng_path.is_file():
        set_rng_state(torch.load(rng_path, weights_only=True))
    return state


def remove_checkpoints(out_dir: Path) -> None:
    shutil.rmtree(out_dir / CHECKPOINTS, ignore_errors=True)
