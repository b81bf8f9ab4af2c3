"""Every long loop of the circuit stage reports progress against a total it sets first (issue 34.3): the answer
check, the scoring passes, the sweep's circuits and the oracle's edges each end at exactly their total."""

from __future__ import annotations

import pytest
import torch

from arithmech.circuits.attribution import edge_scores
from arithmech.circuits.faithfulness import faithfulness_sweep
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.oracle import exact_edge_scores
from arithmech.circuits.prompts import answered_pairs, filter_answered
from arithmech.data.mib_arithmetic import mib_pairs
from reference_circuits import tiny_batch, tiny_view

from tiny_models import make_tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


class Counted:
    """A `Progress` that records the totals it was given and the units done."""

    def __init__(self) -> None:
        self.total: float | None = None
        self.totals: list[float | None] = []
        self.done = 0.0

    def __setattr__(self, name: str, value: object) -> None:
        if name == "total" and hasattr(self, "totals"):
            self.totals.append(value)  # type: ignore[arg-type]
        super().__setattr__(name, value)

    def update(self, n: float | None = 1) -> None:
        self.done += n or 0


@pytest.mark.parametrize(("method", "steps", "batch_size", "passes"), [("eap-ig", 3, 2, 2 * 3), ("eap", 5, 4, 1)])
def test_scoring_counts_its_passes(method: str, steps: int, batch_size: int, passes: int) -> None:
    view = tiny_view("llama")
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    bar = Counted()
    edge_scores(view, graph, tiny_batch(), method=method, steps=steps, batch_size=batch_size, progress=bar)  # type: ignore[arg-type]
    assert bar.totals[0] == passes and bar.done == passes  # tiny_batch: 4 prompts


@pytest.mark.parametrize("ablation", ["counterfactual", "mean"])
def test_the_sweep_counts_its_circuits(ablation: str) -> None:
    view = tiny_view("llama")
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    scores = torch.randn(graph.n_receivers, graph.n_senders, generator=torch.Generator().manual_seed(0))
    bar = Counted()
    faithfulness_sweep(view, graph, tiny_batch(), scores, (1.0, 10.0, 100.0), ablation, batch_size=2, progress=bar)  # type: ignore[arg-type]
    assert bar.totals and bar.totals[0] == bar.done > 2 * 2  # 2 chunks, more than the full and empty circuit each


def test_the_oracle_counts_its_edges() -> None:
    view = tiny_view("llama")
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    edges = [tuple(e) for e in graph.edge_index.tolist()[:7]]
    bar = Counted()
    exact_edge_scores(view, graph, tiny_batch(), edges, circuits_per_pass=3, batch_size=2, progress=bar)  # type: ignore[arg-type]
    assert bar.totals == [2 * 7] and bar.done == 2 * 7


def test_the_answer_check_counts_its_prompts_and_pairs() -> None:
    view = tiny_view("llama")
    tok = make_tiny_tokenizer()
    bar = Counted()
    answered_pairs(view, tok, "addition", 2, seed=0, max_operand=9, batch_size=16, progress=bar)
    assert bar.totals[0] == 80 * 2 and bar.totals[-1] == bar.done > 0  # the cap first, what was checked at the end
    pairs = mib_pairs(tok, "addition", 6, 0, 9)
    bar = Counted()
    filter_answered(view, tok, pairs, "addition", batch_size=4, progress=bar)
    assert bar.totals[0] == len(pairs) and bar.done == len(pairs) == bar.totals[-1]
