"""Whole values of parameters and optimizer state that FSDP2 shards over processes, and back.

Under FSDP2 (`accelerate launch` with `fsdp_version: 2`) every parameter of the trained module is a DTensor
holding one shard per process. Checkpoints, the delta and the merged model need whole tensors, and a resumed
run must put whole tensors back as shards. Without FSDP these functions pass tensors through unchanged, so the
callers have one code path. Every function that gathers or shards is collective: all processes call it, in the
same order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor


def is_sharded(module: nn.Module) -> bool:
    """Whether any parameter of `module` is a DTensor (FSDP2)."""
    return any(isinstance(p, DTensor) for p in module.parameters())


def whole(param: torch.Tensor) -> torch.Tensor:
    """The whole value of `param`, gathered from every process if it is sharded (collective)."""
    return param.full_tensor() if isinstance(param, DTensor) else param


@torch.no_grad()
def load_whole_(param: torch.Tensor, value: torch.Tensor) -> None:
    """Copy the whole `value` into `param`, keeping only this process's shard if `param` is sharded."""
    value = value.to(device=param.device, dtype=param.dtype)
    if isinstance(param, DTensor):
        value = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
    param.copy_(value)


def optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state dict with whole tensors (collective under FSDP2; on the CPU)."""
    if not is_sharded(module):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(module, optimizer, options=options)


def load_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a state dict from `optimizer_state` (every process passes the whole one under FSDP2)."""
    if not is_sharded(module):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(module, optimizer, optim_state_dict=state, options=options)
