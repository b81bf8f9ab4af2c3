"""The exact score of an edge: patch that one edge, recompute everything downstream, and read the metric.

Background
    EAP and EAP-IG (`attribution.py`) estimate, to first order, how much the metric drops when one edge is
    patched. The oracle computes it: exact(s -> r) = m(clean) - m(only s -> r carries the counterfactual),
    with every other edge clean and every node downstream of r recomputed (METHODS.md sec. 9). It is the
    reference that tells how far the estimates can be trusted (Spearman correlation and top-n overlap).

Batching and where a pass starts
    Each edge is one circuit (all edges kept but one). The edges of one receiver r are evaluated together as a
    batch of circuits in one patched forward pass (`patched_end_resid` with keep [circuit, receiver, sender]):
    rows = circuit x prompt, at most `circuits_per_pass` circuits at once. Each pass starts at r's layer L_r and
    at p0, the first position where a chunk's clean and counterfactual tokens differ (`clean_prefix.py`): below
    L_r and before p0 every such circuit computes the clean run, which is run once per chunk. It equals the naive
    loop (one full forward per edge, every receiver rebuilt sender by sender) to 1e-5 on every tiny architecture
    (tests/unit/circuits/test_oracle.py).

Cost model (work in forward passes of the chunk, i.e. N layers x T positions x prompts; attention's score
products and the per-layer swap sums are left out, as in tests/forward_cost.py)
    naive loop:  E                                              one full pass per edge
    oracle:      3 + sum over edges e of (N - L_e) / N x (T - p0) / T
                 + sum over passes of L / N x (T - p0) / T / prompts      (m(clean) is one more pass, at N - 1)
    The 3 are the counterfactual run, the clean run (keeping its keys/values) and the clean sender outputs; the
    last term is the one stand-in row that carries a pass through the layers below L (`run_from_layers`); the
    logits' receiver counts as layer N - 1. Per chunk of prompts (T: the chunk's width), weighted by its size. With
    grouped-query attention each pass runs the attention of its layers on g replicas (`patched.py`), in both.
    Counted exactly in tokens entering decoder layers (tests/unit/circuits/test_oracle.py, `predicted_passes`,
    whose arithmetic is `oracle_cost.oracle_passes`).
    So an edge into layer L costs (N - L) / N of a pass on the positions from p0: the edges into late layers
    and the logits are nearly free, and an edge into layer 0 costs (T - p0) / T of the naive loop's pass. On MIB
    prompts ("Q: How much is A plus B? A: ") p0 is the first operand's position, about a third of the prompt.
    `benchmarks/circuit_oracle.py` prints the model's prediction beside measured multiply-accumulates and times.

On the default model all 123,211 edges would still cost about 2.7 x 10^4 passes of the prompt batch (the cost
model on 16-token MIB prompts that differ from position 6), so the oracle runs on a chosen subset: the top n edges
of a method and n random ones (`oracle_subset`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from arithmech.circuits.batch import CircuitBatch, logit_difference
from arithmech.circuits.clean_prefix import CleanPrefix, first_difference
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.oracle_cost import oracle_passes, pass_groups
from arithmech.circuits.patched import patched_end_resid
from arithmech.circuits.senders import collect_sender_outputs
from arithmech.models.view import ModelView
from arithmech.progress import Progress


@torch.no_grad()
def exact_edge_scores(
    view: ModelView,
    graph: CircuitGraph,
    batch: CircuitBatch,
    edges: Sequence[tuple[int, int]],
    circuits_per_pass: int = 16,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> torch.Tensor:
    """[edge] m(clean) - m(only that edge patched), mean over prompts, for edges given as (receiver, sender);
    `progress` counts edges scored, per chunk of prompts."""
    groups = pass_groups(edges, circuits_per_pass)
    full = torch.ones(graph.n_receivers, graph.n_senders)
    sums = torch.zeros(len(edges), dtype=torch.float64)
    chunks = batch.chunks(batch_size)
    if progress is not None:
        progress.total = len(chunks) * len(edges)
    for chunk in chunks:
        cf = collect_sender_outputs(view, chunk.cf_ids, chunk.mask)
        prefix = CleanPrefix(view, graph, chunk, cf)
        last = prefix.start(graph.n_layers)
        clean_resid, _ = patched_end_resid(view, graph, chunk.clean_ids, chunk.mask, full, cf, start=last)
        m_clean = logit_difference(view, clean_resid, chunk).double().cpu()  # [prompt]
        for group in groups:
            keep = full[None].repeat(len(group), 1, 1)  # [circuit, receiver, sender]
            for c, i in enumerate(group):
                keep[c, edges[i][0], edges[i][1]] = 0.0
            start = prefix.start(receiver_layer(graph, edges[group[0]][0]))
            resid, _ = patched_end_resid(view, graph, chunk.clean_ids, chunk.mask, keep, cf, start=start)
            m = logit_difference(view, resid, _tiled(chunk, len(group))).double().cpu().reshape(len(group), -1)
            sums[group] += (m_clean[None] - m).sum(-1)
            if progress is not None:
                progress.update(len(group))
    return (sums / len(batch)).float()


def predicted_passes(
    graph: CircuitGraph,
    batch: CircuitBatch,
    edges: Sequence[tuple[int, int]],
    batch_size: int = 8,
    circuits_per_pass: int = 16,
) -> float:
    """The cost model of the module docstring (`oracle_cost.oracle_passes`): the oracle's work on `edges`, in
    decoder-layer passes of `batch` (every layer on every position of every prompt)."""
    chunks = [(len(c), int(c.clean_ids.shape[1]), first_difference(c)) for c in batch.chunks(batch_size)]
    groups = [(len(g), receiver_layer(graph, edges[g[0]][0])) for g in pass_groups(edges, circuits_per_pass)]
    return oracle_passes(graph.n_layers, int(batch.clean_ids.shape[1]), chunks, groups)


def receiver_layer(graph: CircuitGraph, receiver: int) -> int:
    """The layer whose input a receiver is (n_layers for the logits)."""
    return receiver // graph.receivers_per_layer


def _tiled(chunk: CircuitBatch, times: int) -> CircuitBatch:
    """The chunk's prompts `times` over, circuit-major, for reading a batch of circuits' answers."""
    return CircuitBatch(
        chunk.clean_ids.repeat(times, 1), chunk.cf_ids.repeat(times, 1), chunk.mask.repeat(times, 1),
        chunk.answer_ids.repeat(times), chunk.cf_answer_ids.repeat(times),
    )  # fmt: skip


def oracle_subset(graph: CircuitGraph, scores: torch.Tensor, n: int, seed: int = 0) -> list[tuple[int, int]]:
    """The top n edges by |score| and n others drawn at random (seeded), as (receiver, sender)."""
    values = graph.to_edges(scores.float()).abs()
    top = torch.sort(values, descending=True, stable=True).indices[:n]
    rest = torch.ones(graph.n_edges, dtype=torch.bool)
    rest[top] = False
    others = rest.nonzero().flatten()
    gen = torch.Generator().manual_seed(seed)
    drawn = others[torch.randperm(len(others), generator=gen)[:n]]
    index = graph.edge_index
    return [tuple(index[i].tolist()) for i in torch.cat([top, drawn])]  # type: ignore[misc]
