"""The batched exact edge oracle equals a naive one-forward-per-edge loop (1e-5)."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.batch import CircuitBatch, logit_difference
from arithmech.circuits.clean_prefix import first_difference
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.oracle import exact_edge_scores, oracle_subset, predicted_passes
from reference_circuits import ARCHS, naive_end_resid, sender_outputs, tiny_batch, tiny_view

from forward_cost import count_layer_tokens

pytestmark = pytest.mark.usefixtures("one_thread")


def shared_start_batch() -> CircuitBatch:
    """MIB-like pairs: the first 3 tokens are the same in the clean and counterfactual prompts (so a pass starts
    at position 3, on the clean run's keys and values of positions 0-2), one prompt shorter (right-padded)."""
    batch = tiny_batch()
    cf = batch.cf_ids.clone()
    cf[:, :3] = batch.clean_ids[:, :3]
    cf[0, 4] = batch.clean_ids[0, 4]  # an equal token after the first difference changes nothing
    return CircuitBatch(batch.clean_ids, cf, batch.mask, batch.answer_ids, batch.cf_answer_ids)


@pytest.mark.parametrize("shared_start", [False, True], ids=["differ-at-0", "shared-start"])
@pytest.mark.parametrize("arch", ARCHS)
def test_oracle_equals_one_forward_per_edge(arch: str, shared_start: bool) -> None:
    """Every receiver layer (layer 0, middle, the logits), several senders per receiver, every architecture."""
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = shared_start_batch() if shared_start else tiny_batch()
    assert first_difference(batch) == (3 if shared_start else 0)
    index = graph.edge_index.tolist()
    middle = [e for e in index if graph.layer_receivers(1).start <= e[0] < graph.layer_receivers(1).stop]
    edges = [tuple(e) for e in index[:5] + middle[5:9] + middle[-3:] + index[-6:]]
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


@pytest.mark.parametrize("arch", ["llama", "gpt-neox"])
def test_cost_model_counts_the_decoder_layer_tokens_the_oracle_runs(arch: str) -> None:
    """`predicted_passes` is the oracle's work exactly, in tokens entering decoder layers (rows x positions)."""
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = shared_start_batch()
    index = graph.edge_index.tolist()
    edges = [tuple(e) for e in index[:5] + index[200:203] + index[-4:]]
    with count_layer_tokens(view) as seen:
        exact_edge_scores(view, graph, batch, edges, circuits_per_pass=3, batch_size=2)  # type: ignore[arg-type]
    one_pass = view.dims.n_layers * batch.clean_ids.numel()  # every layer, every position of every prompt
    predicted = predicted_passes(graph, batch, edges, batch_size=2, circuits_per_pass=3)  # type: ignore[arg-type]
    assert sum(seen) / one_pass == pytest.approx(predicted, rel=1e-9)
    assert predicted < len(edges)  # less than the naive loop's one pass per edge
