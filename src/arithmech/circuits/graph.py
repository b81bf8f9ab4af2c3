"""The computational graph of a transformer as MIB defines it: nodes, edges and their names.

Background
    Since the Mechanistic Interpretability Benchmark (MIB, Mueller et al. 2025) a circuit is a set of edges of
    this graph. Its nodes are the input embedding, every attention head and every MLP, and the logits. The
    residual stream is a sum: the input embedding, each head's output (its z times its W_O block) and each
    MLP's output (plus constant biases). So every node reads a sum of the outputs of the nodes before it,
    and an edge s -> r is one term of the sum that r reads.

Senders and receivers (METHODS.md sec. 9)
    senders     `input`, then per layer l the heads `a{l}.h{h}` (h < H) and the MLP `m{l}`:
                S = 1 + L (H + 1), index of head (l, h) = 1 + l (H + 1) + h, of MLP l = 1 + l (H + 1) + H.
    receivers   per layer l: each query head's query, key and value input `a{l}.h{h}<q|k|v>` (3H, role-major:
                all q, then all k, then all v), then the MLP input `m{l}`; last the `logits`.
                R = L (3H + 1) + 1. Under grouped-query attention the key/value receivers are still one per
                *query* head, as MIB counts them (each query head reads its own keys and values).
    edges       s -> r for every sender before r: attention at layer l reads the 1 + l (H + 1) senders of the
                layers below; the MLP also reads its own layer's heads (sequential blocks) or not (parallel
                blocks, GPT-NeoX); the logits read all S senders.
    count       3H sum_l (1 + l (H + 1)) + sum_l (1 + l (H + 1) + H [sequential]) + 1 + L (H + 1);
                SmolLM2-135M (L = 30, H = 9, sequential): 123,211.

A graph is data: `valid` [receiver, sender] says which pairs are edges; edge i is the i-th True of `valid` in
row-major (receiver-major) order, so scores and circuits are [receiver, sender] tensors or flat edge vectors.

Usage
    >>> graph = CircuitGraph.from_dims(view.dims, parallel=view.parallel_residual)
    >>> graph.n_edges, graph.edge_name(0)
    (123211, 'input->a0.h0<q>')

References: Mueller et al., ICML 2025 (MIB), section 4; Hanna et al. 2024 (EAP-IG graph); METHODS.md sec. 9.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import torch

from arithmech.errors import ConfigError
from arithmech.models.view import Dims

ROLES = ("q", "k", "v")
"""The three inputs of an attention head, in receiver order."""

_HEAD = re.compile(r"a(\d+)\.h(\d+)")
_MLP = re.compile(r"m(\d+)")


@dataclass(frozen=True)
class CircuitGraph:
    """MIB's graph of a model with `n_layers` layers of `n_heads` query heads."""

    n_layers: int
    n_heads: int
    parallel: bool = False
    """Attention and MLP of a layer read the same residual (GPT-NeoX): no edge from a head to its own MLP."""

    @classmethod
    def from_dims(cls, dims: Dims, parallel: bool = False) -> CircuitGraph:
        """The graph of a model with `dims.n_layers` layers and `dims.n_heads` query heads."""
        return cls(dims.n_layers, dims.n_heads, bool(parallel))

    # -- sizes and indices ----------------------------------------------------------------------------------
    @property
    def per_layer(self) -> int:
        """Senders per layer: H heads and one MLP."""
        return self.n_heads + 1

    @property
    def n_senders(self) -> int:
        return 1 + self.n_layers * self.per_layer

    @property
    def receivers_per_layer(self) -> int:
        """3H head inputs (q, k, v) and the MLP input."""
        return 3 * self.n_heads + 1

    @property
    def n_receivers(self) -> int:
        return self.n_layers * self.receivers_per_layer + 1

    def head_sender(self, layer: int, head: int) -> int:
        return 1 + layer * self.per_layer + head

    def mlp_sender(self, layer: int) -> int:
        return 1 + layer * self.per_layer + self.n_heads

    def head_receiver(self, layer: int, role: str, head: int) -> int:
        """Receiver index of query head `head`'s `role` ("q", "k" or "v") input at `layer`."""
        return layer * self.receivers_per_layer + ROLES.index(role) * self.n_heads + head

    def mlp_receiver(self, layer: int) -> int:
        return layer * self.receivers_per_layer + 3 * self.n_heads

    @property
    def logits_receiver(self) -> int:
        return self.n_receivers - 1

    def layer_receivers(self, layer: int) -> slice:
        """The receivers of `layer` (3H head inputs, then the MLP input)."""
        start = layer * self.receivers_per_layer
        return slice(start, start + self.receivers_per_layer)

    def senders_before(self, receiver: int) -> int:
        """How many senders (a prefix in sender order) `receiver` reads."""
        if receiver == self.logits_receiver:
            return self.n_senders
        layer, offset = divmod(receiver, self.receivers_per_layer)
        below = 1 + layer * self.per_layer
        if offset < 3 * self.n_heads or self.parallel:
            return below
        return below + self.n_heads

    @cached_property
    def valid(self) -> torch.Tensor:
        """[receiver, sender] bool: which pairs are edges."""
        reads = torch.tensor([self.senders_before(r) for r in range(self.n_receivers)])
        return torch.arange(self.n_senders)[None, :] < reads[:, None]

    @property
    def n_edges(self) -> int:
        """The edge count by formula (METHODS.md sec. 9); equals `valid.sum()` (tested)."""
        L, H = self.n_layers, self.n_heads
        attn = 3 * H * sum(1 + layer * (H + 1) for layer in range(L))
        mlp = sum(1 + layer * (H + 1) + (0 if self.parallel else H) for layer in range(L))
        return attn + mlp + 1 + L * (H + 1)

    # -- names ----------------------------------------------------------------------------------------------
    def sender_name(self, sender: int) -> str:
        if sender == 0:
            return "input"
        layer, offset = divmod(sender - 1, self.per_layer)
        return f"m{layer}" if offset == self.n_heads else f"a{layer}.h{offset}"

    def receiver_name(self, receiver: int) -> str:
        if receiver == self.logits_receiver:
            return "logits"
        layer, offset = divmod(receiver, self.receivers_per_layer)
        if offset == 3 * self.n_heads:
            return f"m{layer}"
        role, head = divmod(offset, self.n_heads)
        return f"a{layer}.h{head}<{ROLES[role]}>"

    @cached_property
    def sender_names(self) -> list[str]:
        return [self.sender_name(s) for s in range(self.n_senders)]

    @cached_property
    def receiver_names(self) -> list[str]:
        return [self.receiver_name(r) for r in range(self.n_receivers)]

    @cached_property
    def edge_index(self) -> torch.Tensor:
        """[edge, 2] (receiver, sender) of every edge, in edge order (receiver-major)."""
        return self.valid.nonzero()

    def edge_name(self, edge: int) -> str:
        receiver, sender = (int(i) for i in self.edge_index[edge])
        return f"{self.sender_names[sender]}->{self.receiver_names[receiver]}"

    @cached_property
    def edge_names(self) -> list[str]:
        s_names, r_names = self.sender_names, self.receiver_names
        return [f"{s_names[s]}->{r_names[r]}" for r, s in self.edge_index.tolist()]

    @cached_property
    def node_names(self) -> list[str]:
        """MIB's node list: input, then per layer its heads and its MLP, then logits."""
        return [*self.sender_names, "logits"]

    def parse_edge(self, name: str) -> tuple[int, int]:
        """(receiver, sender) of an edge name like `a0.h1->a3.h2<q>`; a ConfigError for a name not in the graph."""
        try:
            sender_name, receiver_name = name.split("->")
            sender, receiver = self._sender_of(sender_name), self._receiver_of(receiver_name)
        except (ValueError, IndexError):
            sender = receiver = -1
        if sender < 0 or receiver < 0 or not bool(self.valid[receiver, sender]):
            raise ConfigError(
                f"edge {name!r} is not in the graph of this model ({self.n_layers} layers x {self.n_heads} heads); "
                "check that the circuit file was made for this model"
            )
        return receiver, sender

    def _sender_of(self, name: str) -> int:
        if name == "input":
            return 0
        if (head := _HEAD.fullmatch(name)) and int(head[2]) < self.n_heads and int(head[1]) < self.n_layers:
            return self.head_sender(int(head[1]), int(head[2]))
        if (mlp := _MLP.fullmatch(name)) and int(mlp[1]) < self.n_layers:
            return self.mlp_sender(int(mlp[1]))
        return -1

    def _receiver_of(self, name: str) -> int:
        if name == "logits":
            return self.logits_receiver
        if name.endswith(">") and name[-3:-2] == "<" and name[-2] in ROLES:
            head = _HEAD.fullmatch(name[:-3])
            if head and int(head[2]) < self.n_heads and int(head[1]) < self.n_layers:
                return self.head_receiver(int(head[1]), name[-2], int(head[2]))
            return -1
        if (mlp := _MLP.fullmatch(name)) and int(mlp[1]) < self.n_layers:
            return self.mlp_receiver(int(mlp[1]))
        return -1

    # -- circuits as tensors ------------------------------------------------------------------------------
    def to_dense(self, edge_values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Edge vector [edge] -> [receiver, sender] with `fill` off the edges."""
        dense = torch.full((self.n_receivers, self.n_senders), fill, dtype=edge_values.dtype)
        dense[self.valid] = edge_values.to(dense.device)
        return dense

    def to_edges(self, dense: torch.Tensor) -> torch.Tensor:
        """[receiver, sender] -> edge vector [edge]."""
        return dense[self.valid.to(dense.device)]
