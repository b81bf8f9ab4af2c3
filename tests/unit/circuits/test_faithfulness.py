"""Faithfulness of circuits, top-k circuits and MIB's CPR / CMD areas."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.batch import logit_difference
from arithmech.circuits.faithfulness import SWEEP_PERCENTS, area_under, circuit_metrics, cmd, cpr, top_edges
from arithmech.circuits.graph import CircuitGraph
from reference_circuits import mean_outputs, naive_end_resid, random_circuit, sender_outputs, tiny_batch, tiny_view

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("arch", "ablation"), [("llama", "counterfactual"), ("gpt2", "mean"), ("gpt-neox", "mean")])
def test_faithfulness_equals_naive_one_forward_per_circuit(arch: str, ablation: str) -> None:
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = tiny_batch()
    circuits = [random_circuit(graph, seed) for seed in (1, 2)]
    result = circuit_metrics(view, graph, batch, circuits, ablation=ablation, batch_size=2)  # type: ignore[arg-type]
    cf = sender_outputs(view, batch.cf_ids, batch.mask)
    ablated = mean_outputs(cf, batch.mask) if ablation == "mean" else cf
    full = torch.ones(graph.n_receivers, graph.n_senders)

    def naive_m(keep: torch.Tensor) -> float:
        with torch.no_grad():
            end = naive_end_resid(view, batch.clean_ids, batch.mask, keep, ablated)
            return float(logit_difference(view, end, batch).mean())

    m_full, m_empty = naive_m(full), naive_m(0 * full)
    assert result.m_full == pytest.approx(m_full, abs=1e-5)
    assert result.m_empty == pytest.approx(m_empty, abs=1e-5)
    for got, keep in zip(result.m.tolist(), circuits, strict=True):
        assert got == pytest.approx(naive_m(keep), abs=1e-5)
    f = circuit_metrics(view, graph, batch, [full, 0 * full], ablation=ablation).faithfulness  # type: ignore[arg-type]
    torch.testing.assert_close(f, torch.tensor([1.0, 0.0]), atol=1e-5, rtol=0)


def test_top_edges_keeps_the_highest_scores() -> None:
    graph = CircuitGraph(2, 2)
    scores = graph.to_dense(torch.linspace(-1, 1, graph.n_edges))
    keep = top_edges(graph, scores, 10.0, absolute=False)
    n = int(0.1 * graph.n_edges)
    assert int(keep.sum()) == n
    assert torch.equal(graph.to_edges(keep)[-n:], torch.ones(n))  # the last (highest) edges
    keep_abs = top_edges(graph, scores, 10.0, absolute=True)
    kept = graph.to_edges(keep_abs).nonzero().flatten().tolist()
    assert 0 in kept and graph.n_edges - 1 in kept  # both ends: |score| is highest there
    assert int(top_edges(graph, scores, 0.1, absolute=False).sum()) == 1  # at least one edge


def test_areas_follow_the_trapezoid_rule() -> None:
    assert area_under([0.0, 0.5, 1.0], [0.0, 1.0, 1.0]) == pytest.approx(0.75)
    ones = [1.0] * len(SWEEP_PERCENTS)
    assert cpr(SWEEP_PERCENTS, ones) == pytest.approx(1 - 0.001)  # f = 1 from 0.1 % to 100 %
    assert cmd(SWEEP_PERCENTS, ones) == pytest.approx(0.0)
    assert cmd(SWEEP_PERCENTS, [0.0] * len(SWEEP_PERCENTS)) == pytest.approx(0.999)
    assert cpr([50.0, 100.0], [0.0, 1.0]) == pytest.approx(0.25)
