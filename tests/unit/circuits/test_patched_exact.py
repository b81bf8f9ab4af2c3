"""The one-pass circuit evaluation equals the sender-by-sender reference on every tiny architecture (1e-5)."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.batch import CircuitBatch, at_end, logit_difference
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.patched import patched_end_resid, projection_weights
from arithmech.circuits.senders import SenderOutputs, check_edge_graph, collect_sender_outputs
from arithmech.circuits.swaps import SwapTerms
from arithmech.errors import SpecError
from reference_circuits import (
    ARCHS,
    mean_outputs,
    naive_end_resid,
    random_circuit,
    sender_outputs,
    tiny_batch,
    tiny_view,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("arch", ARCHS)
def test_circuits_match_the_sender_by_sender_reference(arch: str) -> None:
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = tiny_batch()
    cf = collect_sender_outputs(view, batch.cf_ids, batch.mask)
    cf_naive = sender_outputs(view, batch.cf_ids, batch.mask)
    full = torch.ones(graph.n_receivers, graph.n_senders)
    with torch.no_grad():
        clean_run = at_end(view.final_resid(input_ids=batch.clean_ids, attention_mask=batch.mask), batch.end)
        cf_run = at_end(view.final_resid(input_ids=batch.cf_ids, attention_mask=batch.mask), batch.end)
        for keep in (full, 0 * full, random_circuit(graph, 1), random_circuit(graph, 2)):
            fast, _ = patched_end_resid(view, graph, batch.clean_ids, batch.mask, keep, cf)
            naive = naive_end_resid(view, batch.clean_ids, batch.mask, keep, cf_naive)
            m_fast, m_naive = logit_difference(view, fast, batch), logit_difference(view, naive, batch)
            torch.testing.assert_close(m_fast, m_naive, atol=1e-5, rtol=0)
        ends = [patched_end_resid(view, graph, batch.clean_ids, batch.mask, k, cf)[0] for k in (full, 0 * full)]
        m_full, m_empty = (logit_difference(view, end, batch) for end in ends)
    torch.testing.assert_close(m_full, logit_difference(view, clean_run, batch), atol=1e-5, rtol=0)
    torch.testing.assert_close(m_empty, logit_difference(view, cf_run, batch), atol=1e-5, rtol=0)
    assert (m_full - m_empty).abs().min() > 1e-3  # the comparison is not between two equal runs


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt-neox", "gemma2"])
def test_mean_ablation_matches_the_reference(arch: str) -> None:
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = tiny_batch()
    means = collect_sender_outputs(view, batch.cf_ids, batch.mask).mean(batch.mask)
    means_naive = mean_outputs(sender_outputs(view, batch.cf_ids, batch.mask), batch.mask)
    with torch.no_grad():
        for keep in (torch.zeros(graph.n_receivers, graph.n_senders), random_circuit(graph, 3)):
            fast, _ = patched_end_resid(view, graph, batch.clean_ids, batch.mask, keep, means)
            naive = naive_end_resid(view, batch.clean_ids, batch.mask, keep, means_naive)
            torch.testing.assert_close(
                logit_difference(view, fast, batch), logit_difference(view, naive, batch), atol=1e-5, rtol=0
            )


def test_key_value_weights_are_views_of_the_model_weights() -> None:
    """Grouped-query attention: per-query-head k/v edges, but W_K and W_V are never copied."""
    view = tiny_view("llama")  # 4 query heads, 2 kv heads
    weights = projection_weights(view, 0)
    for role, path in (("k", "self_attn.k_proj"), ("v", "self_attn.v_proj")):
        w, _ = weights[role]
        assert w.shape[0] == view.dims.n_kv_heads
        assert w.data_ptr() == view.module(0, path).weight.data_ptr()


@pytest.mark.parametrize("arch", ARCHS)
def test_the_residual_stream_is_the_sum_of_the_sender_outputs(arch: str) -> None:
    """What the graph's senders write (under Gemma 2/3's post-attention norm, each head's share of the normed
    output) adds up to the residual the final norm reads, at every position."""
    view = tiny_view(arch)
    batch = tiny_batch()
    outs = collect_sender_outputs(view, batch.clean_ids, batch.mask)
    total = outs.embed.clone()
    for layer in range(view.dims.n_layers):
        total += outs.head_outputs(view, layer).sum(0) + outs.mlp_out[layer]
        bias = getattr(view.o_proj(layer), "bias", None)
        total += 0 if bias is None else bias
    with torch.no_grad():
        resid = view.final_resid(input_ids=batch.clean_ids, attention_mask=batch.mask)
    torch.testing.assert_close(total, resid, atol=2e-5, rtol=1e-5)


def test_a_post_attention_norm_with_biases_is_refused() -> None:
    view = tiny_view("gemma2")
    check_edge_graph(view)  # Gemma 2 itself: heads are shares of the normed output
    view.o_proj(0).bias = torch.nn.Parameter(torch.zeros(view.dims.d_model))
    with pytest.raises(SpecError, match="bias"):
        check_edge_graph(view)


def test_sender_outputs_mean_has_one_row() -> None:
    view = tiny_view("llama")
    batch = tiny_batch()
    means = collect_sender_outputs(view, batch.cf_ids, batch.mask).mean(batch.mask)
    assert isinstance(means, SenderOutputs) and means.embed.shape[:2] == (1, 1)


@pytest.mark.parametrize("arch", ["llama", "gpt-neox", "phi3", "gemma3"])
def test_small_and_large_circuits_in_one_pass_match_the_reference(arch: str) -> None:
    """Small circuits are summed from their kept edges (prefix minus kept), large ones from their swapped edges
    (`swaps.py`); both, batched as circuit x prompt rows of one pass, equal the sender-by-sender reference."""
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = tiny_batch()
    cf = collect_sender_outputs(view, batch.cf_ids, batch.mask)
    cf_naive = sender_outputs(view, batch.cf_ids, batch.mask)
    gen = torch.Generator().manual_seed(5)
    keeps = [(torch.rand(graph.n_receivers, graph.n_senders, generator=gen) < p).float() * graph.valid
             for p in (0.03, 0.3, 0.97)]  # fmt: skip
    with torch.no_grad():
        fast, _ = patched_end_resid(view, graph, batch.clean_ids, batch.mask, torch.stack(keeps), cf)
        for c, keep in enumerate(keeps):
            naive = naive_end_resid(view, batch.clean_ids, batch.mask, keep, cf_naive)
            rows = fast[c * len(batch) : (c + 1) * len(batch)]
            torch.testing.assert_close(
                logit_difference(view, rows, batch), logit_difference(view, naive, batch), atol=1e-5, rtol=0
            )


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_prompts_sharing_their_first_tokens_match_the_reference(arch: str) -> None:
    """Where the prompts and their counterfactuals share the first tokens, no swap term is kept there
    (`SwapTerms.start`); the circuits still equal the reference."""
    view = tiny_view(arch)
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    batch = tiny_batch()
    shared = CircuitBatch(
        batch.clean_ids, torch.cat([batch.clean_ids[:, :3], batch.cf_ids[:, 3:]], 1), batch.mask,
        batch.answer_ids, batch.cf_answer_ids,
    )  # fmt: skip
    cf = collect_sender_outputs(view, shared.cf_ids, shared.mask)
    cf_naive = sender_outputs(view, shared.cf_ids, shared.mask)
    keeps = [random_circuit(graph, 7), (torch.rand(graph.n_receivers, graph.n_senders) < 0.05).float() * graph.valid]
    starts = []
    record = SwapTerms.add

    def add(self: SwapTerms, term: torch.Tensor) -> None:
        record(self, term)
        starts.append(self.start)

    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(SwapTerms, "add", add)
        fast, _ = patched_end_resid(view, graph, shared.clean_ids, shared.mask, torch.stack(keeps), cf)
    assert set(starts) == {3}
    with torch.no_grad():
        for c, keep in enumerate(keeps):
            naive = naive_end_resid(view, shared.clean_ids, shared.mask, keep, cf_naive)
            rows = fast[c * len(shared) : (c + 1) * len(shared)]
            torch.testing.assert_close(
                logit_difference(view, rows, shared), logit_difference(view, naive, shared), atol=1e-5, rtol=0
            )
