"""identify's node ranking as an edge ranking: the weakest endpoint's importance."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.faithfulness import top_edges
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.node_ranking import node_edge_scores
from arithmech.models.sites import Component


def test_edge_score_is_the_weaker_endpoints_importance() -> None:
    graph = CircuitGraph(2, 2)
    effects = {Component(0, 0): -0.5, Component(0, 1): 0.1, Component(0): -0.05,
               Component(1, 0): -0.3, Component(1, 1): 0.0, Component(1): -0.2}  # fmt: skip
    scores = node_edge_scores(graph, effects)

    def score(name: str) -> float:
        r, s = graph.parse_edge(name)
        return float(scores[r, s])

    assert score("a0.h0->a1.h0<k>") == pytest.approx(0.3)  # min(|0.5|, |0.3|), signed: supports
    assert score("a0.h1->m1") == pytest.approx(-0.1)  # a0.h1 raises the logit when patched: a = -0.1
    assert score("input->a0.h0<q>") == pytest.approx(0.5)  # the input is always in
    assert score("a0.h0->logits") == pytest.approx(0.5)
    assert score("input->logits") == pytest.approx(1.0)  # twice the largest |a|
    assert bool((scores[~graph.valid] == 0).all())


def test_top_edges_by_magnitude_are_among_the_top_nodes() -> None:
    graph = CircuitGraph(3, 2)
    gen = torch.Generator().manual_seed(0)
    effects = {
        c: float(torch.randn(1, generator=gen))
        for c in [Component(layer, h) for layer in range(3) for h in range(2)]
        + [Component(layer) for layer in range(3)]
    }
    top_nodes = sorted(effects, key=lambda c: -abs(effects[c]))[:3]
    names = {f"a{c.layer}.h{c.head}" if c.head is not None else f"m{c.layer}" for c in top_nodes} | {"input", "logits"}
    keep = top_edges(graph, node_edge_scores(graph, effects), 10.0, absolute=True)
    for r, s in keep.nonzero().tolist():
        assert graph.sender_names[s] in names and graph.receiver_names[r].split("<")[0] in names
