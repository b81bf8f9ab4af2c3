"""Grouped-query attention with a key and value input per query head, without copying a key/value weight.

MIB's graph gives every query head its own key and value inputs, but the attention kernel takes one key and
value per kv head, shared by the g = H / H_kv query heads of its group. Running the unmodified attention module
on g replicas of the batch gives each query head its own: replica j holds, for every kv head k, the keys and
values of query head k g + j, and head h's output z is read from replica h mod g. Everything outside the
attention module runs once; inside it, only the attention scores and mixing run g times (the projections are
computed once by the caller's hooks, see `skipped_input`). g = 1 without grouped-query attention.

Rows are replica-major: row j * batch + i is prompt i in replica j.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from arithmech.models.shared_prefix import SharedPrefix
from arithmech.models.view import Dims, ModelView

_BATCH_KWARGS = ("attention_mask", "position_embeddings", "position_ids")
"""Keyword arguments of an attention module that hold one row per prompt (or one row for all)."""


@dataclass(frozen=True)
class GroupReplicas:
    """The g replicas of a batch of `batch` rows for a model of `dims`."""

    dims: Dims
    batch: int

    @property
    def replicas(self) -> int:
        return self.dims.group_size

    def tiled(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, ...] -> [replicas * batch, ...] (replica-major)."""
        return x if self.replicas == 1 else x.repeat(self.replicas, *([1] * (x.dim() - 1)))

    def batch_tiled(self, x: torch.Tensor) -> torch.Tensor:
        """A per-prompt tensor [batch, ...] repeated over the replicas; one broadcast over the batch stays."""
        return self.tiled(x) if x.shape[0] == self.batch and self.batch > 1 else x

    def attention_inputs(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Pre-hook (with kwargs) on the attention module: its batch inputs repeated over the replicas."""
        if args:
            args = (self.tiled(args[0]), *args[1:])
        else:
            kwargs = {**kwargs, "hidden_states": self.tiled(kwargs["hidden_states"])}
        for name in _BATCH_KWARGS:
            value = kwargs.get(name)
            if isinstance(value, torch.Tensor):
                kwargs[name] = self.batch_tiled(value)
            elif isinstance(value, tuple):
                kwargs[name] = tuple(self.batch_tiled(v) if isinstance(v, torch.Tensor) else v for v in value)
        for name, value in kwargs.items():
            if hasattr(value, "update") and not isinstance(value, dict):  # a prefix's key/value cache
                kwargs[name] = _ReplicaCache(value, self.replicas, self.batch)
        return args, kwargs

    def shared_start(self, view: ModelView, tokens: torch.Tensor) -> dict[str, Any]:
        """Base-model inputs that continue after `tokens` [shared] (the same in every row): their key/value cache,
        run once and indexed out for every row (the attention's replicas read it through `attention_inputs`)."""
        if len(tokens) == 0:
            return {"use_cache": False}
        prefix = SharedPrefix.of_tokens(view, tokens)
        return {"use_cache": True, prefix.arg: prefix.past(torch.zeros(self.batch, dtype=torch.long))}

    def heads_from_replicas(self, z: torch.Tensor) -> torch.Tensor:
        """o_proj input [replicas * batch, pos, head * d_head] -> [batch, pos, head * d_head], head h from
        replica h mod g."""
        g, d = self.replicas, self.dims
        if g == 1:
            return z
        z6 = z.reshape(g, self.batch, z.shape[1], d.n_kv_heads, g, d.d_head)
        z = torch.diagonal(z6, dim1=0, dim2=4)  # [batch, pos, kv, d_head, group]
        return z.permute(0, 1, 2, 4, 3).reshape(self.batch, z.shape[1], -1)

    def per_query_head(self, y: torch.Tensor, n: int) -> torch.Tensor:
        """Per-head tensor of the replicas [replicas * batch, pos, n, d_head] (n = query or kv heads) ->
        [query head, batch, pos, d_head]: what query head h = k g + j reads, from replica j."""
        g, d = self.replicas, self.dims
        y = y.reshape(g, self.batch, y.shape[1], n, d.d_head)  # [replica, batch, pos, n, d_head]
        if n == d.n_heads:  # queries: head h from replica h mod g
            y = y.reshape(g, self.batch, y.shape[2], d.n_kv_heads, g, d.d_head)
            y = torch.diagonal(y, dim1=0, dim2=4)  # [batch, pos, kv, d_head, group]
            return y.permute(2, 4, 0, 1, 3).reshape(d.n_heads, self.batch, -1, d.d_head)
        return y.permute(3, 0, 1, 2, 4).reshape(d.n_heads, self.batch, -1, d.d_head)  # kv head k, replica j


class _ReplicaCache:
    """A read-only prefix cache seen by the attention's replicas of the batch: each replica the batch's keys."""

    def __init__(self, cache: Any, replicas: int, batch: int) -> None:
        self.cache, self.replicas, self.batch = cache, replicas, batch

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """[replicas * batch, kv_head, prefix + pos, d_head] each: the prefix repeated, then the new keys."""
        none = key_states[: self.batch, :, :0], value_states[: self.batch, :, :0]
        keys, values = self.cache.update(*none, *args, **kwargs)  # [batch, kv_head, prefix, d_head]
        tiled = [t.repeat(self.replicas, 1, 1, 1) for t in (keys, values)]
        return torch.cat([tiled[0], key_states], dim=-2), torch.cat([tiled[1], value_states], dim=-2)


def skipped_input(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Pre-hook for a module whose output a post-hook replaces: it computes one position of one row instead."""
    return (args[0][:1, :1], *args[1:])
