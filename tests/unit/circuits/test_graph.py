"""MIB's graph: edge counts by formula and by enumeration, names, parsing."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.graph import CircuitGraph
from arithmech.errors import ConfigError


def test_default_model_has_mibs_edge_count() -> None:
    """SmolLM2-135M: 30 layers, 9 query heads (3 kv heads, counted per query head), sequential blocks."""
    graph = CircuitGraph(n_layers=30, n_heads=9)
    assert graph.n_edges == 123_211
    assert int(graph.valid.sum()) == 123_211
    assert len(graph.edge_names) == 123_211 and len(set(graph.edge_names)) == 123_211


@pytest.mark.parametrize(("layers", "heads", "parallel"), [(1, 1, False), (2, 4, False), (3, 2, True), (4, 3, True)])
def test_formula_equals_enumeration(layers: int, heads: int, parallel: bool) -> None:
    graph = CircuitGraph(layers, heads, parallel)
    assert graph.n_edges == int(graph.valid.sum())


def test_hand_counted_two_layer_graph() -> None:
    """L = 2, H = 1, sequential: q/k/v of a0 read input (3); m0 reads input, a0.h0 (2); a1's q/k/v read
    input, a0.h0, m0 (9); m1 reads those and a1.h0 (4); logits read all 5 senders: 23 edges."""
    assert CircuitGraph(2, 1).n_edges == 23
    assert CircuitGraph(2, 1, parallel=True).n_edges == 21  # m0 and m1 lose their own layer's head


def test_names_follow_mib() -> None:
    graph = CircuitGraph(4, 3)
    assert graph.node_names[:5] == ["input", "a0.h0", "a0.h1", "a0.h2", "m0"]
    assert graph.node_names[-1] == "logits"
    assert graph.edge_names[0] == "input->a0.h0<q>"
    assert "a0.h1->a3.h2<q>" in graph.edge_names
    assert "a1.h0->m1" in graph.edge_names and "a1.h0->a1.h2<k>" not in graph.edge_names
    assert graph.edge_names[-1] == "m3->logits"


def test_parse_round_trips_every_edge() -> None:
    graph = CircuitGraph(3, 2, parallel=True)
    for i, name in enumerate(graph.edge_names):
        receiver, sender = graph.parse_edge(name)
        assert graph.edge_index[i].tolist() == [receiver, sender]


@pytest.mark.parametrize("name", ["a2.h0->a1.h0<q>", "a0.h9->m1", "m0->a0.h0<v>", "x->logits", "a0.h0<q>"])
def test_parse_refuses_edges_not_in_the_graph(name: str) -> None:
    with pytest.raises(ConfigError, match="not in the graph"):
        CircuitGraph(3, 2).parse_edge(name)


def test_dense_and_edge_vectors_round_trip() -> None:
    graph = CircuitGraph(2, 3)
    values = torch.arange(graph.n_edges, dtype=torch.float32)
    assert torch.equal(graph.to_edges(graph.to_dense(values)), values)
