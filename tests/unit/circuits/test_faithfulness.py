"""Faithfulness of circuits, top-k circuits and MIB's CPR / CMD areas."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.batch import logit_difference
from arithmech.circuits.faithfulness import (
    SWEEP_PERCENTS,
    SeededSweeps,
    Spread,
    SweepResult,
    area_under,
    circuit_metrics,
    cmd,
    cpr,
    top_edges,
)
from arithmech.circuits.graph import CircuitGraph
from reference_circuits import (
    mean_outputs,
    naive_end_resid,
    random_circuit,
    sender_outputs,
    shared_start_batch,
    tiny_batch,
    tiny_view,
)

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


def test_sweep_runs_each_distinct_circuit_once_and_equals_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The k = 100 % circuits are the full circuit, the empty one is the counterfactual run, and equal circuits
    of the two rankings run once; every f still equals one naive forward per circuit."""
    import arithmech.circuits.faithfulness as faithfulness

    view = tiny_view("llama")
    graph = CircuitGraph.from_dims(view.dims)
    batch = tiny_batch()
    scores = graph.to_dense(torch.linspace(0.1, 1.0, graph.n_edges))  # all positive: signed = absolute ranking
    run: list[int] = []
    patched = faithfulness.patched_end_resid

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        run.append(int(args[4].shape[0]))
        return patched(*args, **kwargs)

    monkeypatch.setattr(faithfulness, "patched_end_resid", counted)
    percents = (5.0, 50.0, 100.0)
    sweep = faithfulness.faithfulness_sweep(view, graph, batch, scores, percents, batch_size=3)
    assert sum(run) == 2  # 5 % and 50 %, once each, for both rankings
    cf = sender_outputs(view, batch.cf_ids, batch.mask)
    with torch.no_grad():
        for k, f, m in zip(percents, sweep.f_absolute, sweep.m_absolute, strict=True):
            keep = top_edges(graph, scores, k, absolute=True)
            naive = float(
                logit_difference(view, naive_end_resid(view, batch.clean_ids, batch.mask, keep, cf), batch).mean()
            )
            assert m == pytest.approx(naive, abs=1e-5)
            assert f == pytest.approx((naive - sweep.m_empty) / (sweep.m_full - sweep.m_empty), abs=1e-4)
    assert sweep.f_signed == sweep.f_absolute


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt-neox", "phi3"])
def test_positions_shared_by_every_prompt_run_once_and_change_nothing(arch: str) -> None:
    """Prompts and counterfactuals that start with the same tokens: those positions run once as a key/value cache
    (`patched_end_resid(shared=...)`), and every circuit's m still equals one naive forward per circuit."""
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = shared_start_batch()
    assert batch.shared_positions == 3
    circuits = [random_circuit(graph, 3), (torch.rand(graph.n_receivers, graph.n_senders) < 0.05).float()]
    result = circuit_metrics(view, graph, batch, circuits, batch_size=3)
    cf = sender_outputs(view, batch.cf_ids, batch.mask)
    with torch.no_grad():
        for got, keep in zip(result.m.tolist(), circuits, strict=True):
            naive = naive_end_resid(view, batch.clean_ids, batch.mask, keep * graph.valid, cf)
            assert got == pytest.approx(float(logit_difference(view, naive, batch).mean()), abs=1e-5)


def test_seeded_sweeps_average_curves_and_areas() -> None:
    """The mean curve is the mean f per size; CPR's mean equals the mean curve's CPR (linear in f), CMD's does not
    (|1 - f| is not linear): the row of the random ranking gives the mean of the seeds' CMD."""

    def sweep(fs: tuple[float, ...]) -> SweepResult:
        return SweepResult(percents=(10.0, 100.0), edges=(1, 10), f_signed=fs, f_absolute=fs, m_signed=fs,
                           m_absolute=fs, m_full=1.0, m_empty=0.0)  # fmt: skip

    seeded = SeededSweeps((0, 1), (sweep((0.5, 1.0)), sweep((1.5, 1.0))))
    assert seeded.mean.f_signed == (1.0, 1.0) and seeded.mean.cmd == pytest.approx(0.0)
    assert seeded.cmd.mean == pytest.approx(0.9 * 0.5 / 2) and seeded.cmd.sd == pytest.approx(0.0)
    assert seeded.cpr.mean == pytest.approx(seeded.mean.cpr)
    assert (seeded.cpr.min, seeded.cpr.max) == pytest.approx((0.9 * 1.5 / 2, 0.9 * 2.5 / 2))
    assert Spread.of([2.0]) == Spread(2.0, None, 2.0, 2.0) and Spread.of([1.0, 3.0]).sd == pytest.approx(2**0.5)
