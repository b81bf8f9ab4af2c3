"""EAP and EAP-IG edge scores equal a naive per-edge gradient-times-difference on tiny models."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.attribution import edge_scores
from arithmech.circuits.batch import logit_difference
from arithmech.circuits.gradients import receiver_gradients
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.patched import patched_end_resid
from arithmech.circuits.senders import collect_sender_outputs
from reference_circuits import ARCHS, naive_end_resid, sender_outputs, shared_start_batch, tiny_batch, tiny_view

pytestmark = pytest.mark.usefixtures("one_thread")


def naive_scores(view, batch, alphas: list[float]) -> torch.Tensor:  # noqa: ANN001
    """d mean(m) / d shift[r, s] at shift = 0, where r's input moves by shift x (out_s(clean) - out_s(cf)),
    averaged over runs with token embeddings interpolated at each alpha; one autograd graph per alpha."""
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    clean = sender_outputs(view, batch.clean_ids, batch.mask)
    cf = sender_outputs(view, batch.cf_ids, batch.mask)
    diff = [c - f for c, f in zip(clean, cf, strict=True)]
    keep = torch.ones(graph.n_receivers, graph.n_senders)
    total = torch.zeros(graph.n_receivers, graph.n_senders)
    for alpha in alphas:
        shift = torch.zeros(graph.n_receivers, graph.n_senders, requires_grad=True)
        interp = {} if alpha == 1.0 else {"embed_alpha": alpha, "cf_ids": batch.cf_ids}
        end = naive_end_resid(view, batch.clean_ids, batch.mask, keep, cf, shift=shift, shift_by=diff, **interp)
        (grad,) = torch.autograd.grad(logit_difference(view, end, batch).mean(), shift)
        total += grad / len(alphas)
    return total * graph.valid


@pytest.mark.parametrize("arch", ARCHS)
def test_eap_equals_naive_gradient_times_difference(arch: str) -> None:
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = tiny_batch()
    fast = edge_scores(view, graph, batch, method="eap", batch_size=2)  # two chunks: the mean over prompts
    naive = naive_scores(view, batch, [1.0])
    assert fast.abs().max() > 1e-2
    torch.testing.assert_close(fast, naive, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt-neox", "phi3"])
def test_eap_ig_equals_naive_integrated_gradients(arch: str) -> None:
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = tiny_batch()
    fast = edge_scores(view, graph, batch, method="eap-ig", steps=3)
    naive = naive_scores(view, batch, [1 / 3, 2 / 3, 1.0])
    torch.testing.assert_close(fast, naive, atol=1e-5, rtol=1e-4)
    eap = edge_scores(view, graph, batch, method="eap")
    assert (fast - eap).abs().max() > 1e-3  # the interpolation changes the scores


def test_scores_are_zero_off_the_edges_and_hold_no_graph() -> None:
    view = tiny_view("llama")
    graph = CircuitGraph.from_dims(view.dims)
    scores = edge_scores(view, graph, tiny_batch(), method="eap")
    assert bool((scores[~graph.valid] == 0).all())
    assert not scores.requires_grad


@pytest.mark.parametrize("arch", ["llama", "phi3", "gpt-neox"])
def test_intact_run_gradients_equal_the_patched_pass_probes(arch: str) -> None:
    """Two implementations of d m / d x_r: the intact run's assembled gradients (`gradients.py`) and a probe on
    every receiver input of the patched pass with the full circuit (`patched.py`)."""
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = tiny_batch()
    assembled, _ = receiver_gradients(view, graph, batch, [1.0])
    cf = collect_sender_outputs(view, batch.cf_ids, batch.mask)
    with torch.enable_grad():
        full = torch.ones(graph.n_receivers, graph.n_senders)
        end, probes = patched_end_resid(view, graph, batch.clean_ids, batch.mask, full, cf, probe=True)
        grads = torch.autograd.grad(logit_difference(view, end, batch).sum(), probes)
    torch.testing.assert_close(assembled, torch.cat(grads), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "phi3"])
def test_positions_shared_by_every_prompt_run_once_and_change_no_score(arch: str) -> None:
    """Prompts and counterfactuals that start with the same tokens: those positions run once as a key/value cache
    and carry no score (no sender's output differs there); EAP-IG still equals the naive gradient x difference."""
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = shared_start_batch()
    assert batch.shared_positions == 3
    fast = edge_scores(view, graph, batch, method="eap-ig", steps=2)
    torch.testing.assert_close(fast, naive_scores(view, batch, [0.5, 1.0]), atol=1e-5, rtol=1e-4)
