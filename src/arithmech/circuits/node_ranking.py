"""A node ranking (identify's path patching, 2024) turned into an edge ranking, so that MIB's sweep scores it.

Rule (weakest link): a node's importance is a(c) = -effect(c), its path-patching effect with the sign flipped
(a head that carries the answer lowers the answer logit when patched: effect < 0, a > 0). The input and the
logits are always in (importance +inf). An edge's score is the importance of the endpoint with the smaller
|a|; so |score| = min(|a_sender|, |a_receiver node|), and the top k % of edges by |score| are the edges
among the most important nodes: a node circuit grown node by node, as identify's ranking grows it. Where
both endpoints are +inf (input -> logits) the score is twice the largest finite |a|. The receiver node of a
head's q, k or v input is that head.

References: Zhang et al. 2024 (path patching of heads and MLPs); Mueller et al. 2025 (MIB's edge sweep).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from arithmech.circuits.graph import CircuitGraph
from arithmech.models.sites import Component


def node_edge_scores(graph: CircuitGraph, effects: Mapping[Component, float]) -> torch.Tensor:
    """[receiver, sender] edge scores from per-component path-patching effects (0 off the edges)."""
    importance = torch.full((graph.n_senders,), float("inf"))  # the input: always in
    for component, effect in effects.items():
        index = (
            graph.mlp_sender(component.layer)
            if component.head is None
            else graph.head_sender(component.layer, component.head)
        )
        importance[index] = -float(effect)
    receiver_node = torch.tensor([_receiver_node(graph, r) for r in range(graph.n_receivers)])
    node = torch.where(receiver_node >= 0, importance[receiver_node.clamp(min=0)], float("inf"))  # [receiver]
    sender = importance[None, :].expand(graph.n_receivers, -1)
    receiver = node[:, None].expand(-1, graph.n_senders)
    scores = torch.where(sender.abs() <= receiver.abs(), sender, receiver)  # [receiver, sender]
    finite = importance[importance.isfinite()].abs()
    top = 2 * float(finite.max()) if len(finite) else 1.0
    return scores.nan_to_num(posinf=top) * graph.valid


def _receiver_node(graph: CircuitGraph, receiver: int) -> int:
    """The sender index of the node a receiver belongs to; -1 for the logits."""
    if receiver == graph.logits_receiver:
        return -1
    layer, offset = divmod(receiver, graph.receivers_per_layer)
    if offset == 3 * graph.n_heads:
        return graph.mlp_sender(layer)
    return graph.head_sender(layer, offset % graph.n_heads)
