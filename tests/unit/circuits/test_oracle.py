"""The batched exact edge oracle equals a naive one-forward-per-edge loop (1e-5)."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.batch import logit_difference
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.oracle import exact_edge_scores, oracle_subset
from reference_circuits import naive_end_resid, sender_outputs, tiny_batch, tiny_view

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt-neox", "phi3"])
def test_oracle_equals_one_forward_per_edge(arch: str) -> None:
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = tiny_batch()
    index = graph.edge_index.tolist()
    edges = [tuple(e) for e in index[:5] + index[40:44] + index[-6:]]  # several senders per receiver
    fast = exact_edge_scores(view, graph, batch, edges, circuits_per_pass=3, batch_size=2)  # type: ignore[arg-type]
    cf = sender_outputs(view, batch.cf_ids, batch.mask)
    full = torch.ones(graph.n_receivers, graph.n_senders)
    with torch.no_grad():
        m_clean = logit_difference(view, naive_end_resid(view, batch.clean_ids, batch.mask, full, cf), batch)
        naive = []
        for receiver, sender in edges:
            keep = full.clone()
            keep[receiver, sender] = 0.0
            end = naive_end_resid(view, batch.clean_ids, batch.mask, keep, cf)
            naive.append(float((m_clean - logit_difference(view, end, batch)).mean()))
    torch.testing.assert_close(fast, torch.tensor(naive), atol=1e-5, rtol=0)
    assert fast.abs().max() > 1e-3


def test_subset_is_top_n_and_random_others() -> None:
    graph = CircuitGraph(2, 2)
    scores = graph.to_dense(torch.linspace(-1, 0.5, graph.n_edges))
    edges = oracle_subset(graph, scores, 3, seed=0)
    assert len(edges) == 6 and len(set(edges)) == 6
    assert edges[0] == tuple(graph.edge_index[0].tolist())  # |-1| is the largest
    assert edges == oracle_subset(graph, scores, 3, seed=0)
