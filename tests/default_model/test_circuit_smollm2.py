"""Edge circuits on the real default model (SmolLM2-135M: 30 layers, 9 query heads, 3 kv heads)."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.batch import logit_difference
from arithmech.circuits.faithfulness import circuit_metrics
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.patched import patched_end_resid
from arithmech.circuits.prompts import answered_pairs, circuit_batch
from arithmech.circuits.senders import collect_sender_outputs
from arithmech.data.mib_arithmetic import mib_pairs
from arithmech.models.load import ModelHandle, load_model
from reference_circuits import naive_end_resid, random_circuit, sender_outputs

pytestmark = pytest.mark.default_model


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    pytest.importorskip("gguf")
    return load_model()


def test_default_model_graph_has_mibs_edge_count(handle: ModelHandle) -> None:
    graph = CircuitGraph.from_dims(handle.dims, handle.view.parallel_residual)
    assert (handle.dims.n_layers, handle.dims.n_heads, handle.dims.n_kv_heads) == (30, 9, 3)
    assert graph.n_edges == 123_211


def test_mib_prompts_score_the_leading_digit(handle: ModelHandle) -> None:
    """SmolLM2 splits " 68" into " ", "6", "8": the prompt keeps the space, the scored token is "6"."""
    tok = handle.tokenizer
    for pair in mib_pairs(tok, "addition", 8):
        assert pair.reference.endswith("A: ")
        assert tok.decode([pair.extra["answer_id"]]) == pair.answer[0]


def test_one_pass_circuit_equals_the_reference_on_smollm2(handle: ModelHandle) -> None:
    view = handle.view
    graph = CircuitGraph.from_dims(handle.dims)
    batch = circuit_batch(handle.tokenizer, mib_pairs(handle.tokenizer, "addition", 2))
    keep = random_circuit(graph, 0)
    with torch.no_grad():
        cf = collect_sender_outputs(view, batch.cf_ids, batch.mask)
        fast, _ = patched_end_resid(view, graph, batch.clean_ids, batch.mask, keep, cf)
        naive = naive_end_resid(view, batch.clean_ids, batch.mask, keep, sender_outputs(view, batch.cf_ids, batch.mask))
        m_fast, m_naive = logit_difference(view, fast, batch), logit_difference(view, naive, batch)
    torch.testing.assert_close(m_fast, m_naive, atol=1e-4, rtol=0)


@pytest.mark.parametrize("part", [None, "test"])  # every fact (--in-sample), and the held-out test part
def test_answer_filter_gives_faithfulness_its_two_ends(handle: ModelHandle, part: str | None) -> None:
    """On the kept pairs the clean run prefers the answer and the counterfactual run the counterfactual answer,
    so m(full) > 0 > m(empty) (with a clean-only filter m(empty) came out positive on this model)."""
    pairs, counts = answered_pairs(handle.view, handle.tokenizer, "addition", 2, seed=0, max_operand=99, part=part)
    assert len(pairs) == counts.kept == 2 and counts.prompts_answered < counts.prompts_drawn
    graph = CircuitGraph.from_dims(handle.dims)
    result = circuit_metrics(handle.view, graph, circuit_batch(handle.tokenizer, pairs), [])
    assert result.m_full > 0 > result.m_empty
