"""Faithfulness of circuits, the sweep over circuit sizes, and MIB's CPR and CMD.

Background (MIB, Mueller et al. 2025, section 4)
    A circuit is judged by how much of the model's behaviour it keeps when every edge outside it is ablated
    (`patched.py`). With m the mean logit difference (answer minus counterfactual answer, at END):
        f(C) = (m(C) - m(empty)) / (m(full) - m(empty))
    m(full) is the clean run and m(empty) the run with every edge ablated (the counterfactual run under
    counterfactual ablation). A ranking of the edges gives circuits of every size: the top k % of edges,
    k in SWEEP_PERCENTS. Two areas summarise the curve, over x = k / 100 by the trapezoid rule:
        CPR = area under f(x),       edges ranked by signed score (higher is better: the circuit helps);
        CMD = area under |1 - f(x)|, edges ranked by |score|      (lower is better: the circuit is faithful).

Circuit of k %: the int(k / 100 x edges) edges of highest score (stable sort, ties kept in edge order), at
least one edge.

Held-out pairs: the edges are scored on one set of prompt pairs and the sweep runs on another (MIB finds circuits
on its train split and evaluates them on validation), so f, CPR and CMD say how well a circuit generalises, not
how well it fits the pairs it was found on (`stages/circuit.py` chooses the pairs; the functions here take any).

Random baseline: a random ranking is one draw; its CPR and CMD vary with the seed, so it is swept for several
seeds (`SeededSweeps`): its curve is the mean f per size, its CPR and CMD the mean of each seed's (CPR is linear
in f, so that equals the mean curve's area; CMD, the area of |1 - f|, is not), with their spread (`Spread`).

Cost, per chunk of prompts (F = one plain forward pass of the chunk, logits at every position included): the
counterfactual sender outputs (one plain pass, ~0.8 F; that run is the empty circuit under counterfactual
ablation), the clean run (~0.8 F; the full circuit, which is also k = 100 %), and every other distinct circuit
once, as circuit x prompt rows of patched passes (`patched.py`: from ~0.9 F per row for a small circuit to ~2.5 F
for one that keeps and swaps edges everywhere). Under counterfactual ablation the first positions that every
prompt and counterfactual share (MIB's "Q: How much is", 6 of 16 tokens on SmolLM2) run once as a key/value
cache and the patched rows start after them. The sweep (10 sizes, two rankings) is 2 passes + 18 rows: about
24 F on SmolLM2-135M by CPU time (benchmarks/circuits.py, 8 and 16 prompts; about 30 F without the shared
start).
Memory: the swap terms of every sender per row (`patched.py`), circuits_per_pass x prompts rows at once.

References: Mueller et al., ICML 2025 (MIB), section 4 and its circuit-track code; METHODS.md sec. 9.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from arithmech.circuits.attribution_cost import SWEEP_CIRCUITS_PER_PASS
from arithmech.circuits.batch import CircuitBatch, at_end, logit_difference
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.patched import patched_end_resid
from arithmech.circuits.senders import SenderOutputs, collect_sender_outputs
from arithmech.models.view import ModelView
from arithmech.progress import Progress

Ablation = Literal["counterfactual", "mean"]
ABLATIONS: tuple[str, ...] = ("counterfactual", "mean")
SWEEP_PERCENTS: tuple[float, ...] = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


@dataclass(frozen=True)
class CircuitMetrics:
    """Mean metric of each circuit and of the full and empty circuits."""

    m: torch.Tensor  # [circuit]
    m_full: float
    m_empty: float

    @property
    def faithfulness(self) -> torch.Tensor:
        """[circuit] f(C) = (m(C) - m(empty)) / (m(full) - m(empty))."""
        return (self.m - self.m_empty) / (self.m_full - self.m_empty)


def mean_sender_outputs(view: ModelView, batch: CircuitBatch, batch_size: int) -> SenderOutputs:
    """Every sender's output averaged over the counterfactual prompts and their real positions."""
    parts = []
    for chunk in batch.chunks(batch_size):
        cf = collect_sender_outputs(view, chunk.cf_ids, chunk.mask)
        weight = float(chunk.mask.sum())
        parts.append((cf.mean(chunk.mask), weight))
    total = sum(w for _, w in parts)
    return SenderOutputs(
        embed=sum(p.embed * (w / total) for p, w in parts),  # type: ignore[arg-type]
        z=sum(p.z * (w / total) for p, w in parts),  # type: ignore[arg-type]
        mlp_out=sum(p.mlp_out * (w / total) for p, w in parts),  # type: ignore[arg-type]
    )


@torch.no_grad()
def circuit_metrics(
    view: ModelView,
    graph: CircuitGraph,
    batch: CircuitBatch,
    circuits: Sequence[torch.Tensor],
    ablation: Ablation = "counterfactual",
    batch_size: int = 16,
    circuits_per_pass: int = SWEEP_CIRCUITS_PER_PASS,
    progress: Progress | None = None,
) -> CircuitMetrics:
    """m of each circuit (keep [receiver, sender]), of the full and of the empty circuit.

    Per chunk of `batch_size` prompts: one plain pass for the counterfactual sender outputs (whose own run is
    the empty circuit under counterfactual ablation), one plain clean pass (the full circuit), and the other
    distinct circuits `circuits_per_pass` at a time as circuit x prompt rows of one patched pass. A circuit
    equal to the full or the empty one, or to another, is not run again. `progress` counts circuits run, per chunk
    (the full and the empty circuit among them)."""
    means = mean_sender_outputs(view, batch, batch_size) if ablation == "mean" else None
    valid = graph.valid.float()
    distinct: list[torch.Tensor] = [torch.zeros_like(valid)] if means is not None else []  # mean: empty is run
    rows = [_row(distinct, valid, keep.float().cpu() * valid, means is None) for keep in circuits]
    sums = torch.zeros(2 + len(distinct), dtype=torch.float64)  # full, empty, then the distinct circuits
    device = view.o_proj(0).weight.device
    chunks = batch.chunks(batch_size)
    if progress is not None:
        progress.total = len(chunks) * (2 + len(distinct) - (means is not None))
    for chunk in chunks:
        cf = collect_sender_outputs(view, chunk.cf_ids, chunk.mask)
        clean = view.final_resid(
            input_ids=chunk.clean_ids.to(device), attention_mask=chunk.mask.to(device), use_cache=False
        )
        sums[0] += _metric_sum(view, at_end(clean, chunk.end), chunk)
        if means is None:
            assert cf.end_resid is not None
            sums[1] += _metric_sum(view, cf.end_resid, chunk)
        if progress is not None:
            progress.update(1 + (means is None))
        ablated = means if means is not None else cf
        for start in range(0, len(distinct), circuits_per_pass):
            keeps = torch.stack(distinct[start : start + circuits_per_pass])  # [circuit, receiver, sender]
            shared = chunk.shared_positions if means is None else 0  # a mean differs at every position
            end_resid, _ = patched_end_resid(view, graph, chunk.clean_ids, chunk.mask, keeps, ablated, shared=shared)
            for c, resid in enumerate(end_resid.reshape(len(keeps), len(chunk), -1)):  # rows circuit-major
                sums[2 + start + c] += _metric_sum(view, resid, chunk)
            if progress is not None:
                progress.update(len(keeps))
    if means is not None:
        sums[1] = sums[2]
    m = (sums / len(batch)).float()
    return CircuitMetrics(m=m[torch.tensor(rows, dtype=torch.long)], m_full=float(m[0]), m_empty=float(m[1]))


def _row(distinct: list[torch.Tensor], valid: torch.Tensor, keep: torch.Tensor, empty_is_cf: bool) -> int:
    """The row of `keep`'s metric: 0 = the full circuit, 1 = the counterfactual run (the empty circuit under
    counterfactual ablation), 2 + i = distinct[i] (appended when new)."""
    if torch.equal(keep, valid):
        return 0
    if empty_is_cf and not bool(keep.any()):
        return 1
    for i, other in enumerate(distinct):
        if torch.equal(other, keep):
            return 2 + i
    distinct.append(keep)
    return 1 + len(distinct)


def _metric_sum(view: ModelView, end_resid: torch.Tensor, chunk: CircuitBatch) -> float:
    return float(logit_difference(view, end_resid, chunk).double().sum())


def top_edges(graph: CircuitGraph, scores: torch.Tensor, percent: float, absolute: bool) -> torch.Tensor:
    """Circuit keep [receiver, sender] of the top `percent` % of edges by score (or |score|)."""
    values = graph.to_edges(scores.float())
    values = values.abs() if absolute else values
    n = max(1, int(percent / 100 * graph.n_edges))
    order = torch.sort(values, descending=True, stable=True).indices[:n]
    kept = torch.zeros(graph.n_edges)
    kept[order] = 1.0
    return graph.to_dense(kept)


def area_under(x: Sequence[float], y: Sequence[float]) -> float:
    """Trapezoid area of y over x (x increasing)."""
    return float(sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1)))


def cpr(percents: Sequence[float], f_signed: Sequence[float]) -> float:
    """Circuit performance ratio: area under f over the fraction of edges kept (signed ranking)."""
    return area_under([p / 100 for p in percents], list(f_signed))


def cmd(percents: Sequence[float], f_absolute: Sequence[float]) -> float:
    """Circuit-model difference: area under |1 - f| over the fraction of edges kept (absolute ranking)."""
    return area_under([p / 100 for p in percents], [abs(1 - f) for f in f_absolute])


@dataclass(frozen=True)
class SweepResult:
    """Faithfulness of the top-k % circuits of one ranking, both ways (signed for CPR, absolute for CMD)."""

    percents: tuple[float, ...]
    edges: tuple[int, ...]  # edges kept at each size
    f_signed: tuple[float, ...]
    f_absolute: tuple[float, ...]
    m_signed: tuple[float, ...]
    m_absolute: tuple[float, ...]
    m_full: float
    m_empty: float

    @property
    def cpr(self) -> float:
        return cpr(self.percents, self.f_signed)

    @property
    def cmd(self) -> float:
        return cmd(self.percents, self.f_absolute)


def faithfulness_sweep(
    view: ModelView,
    graph: CircuitGraph,
    batch: CircuitBatch,
    scores: torch.Tensor,
    percents: Sequence[float] = SWEEP_PERCENTS,
    ablation: Ablation = "counterfactual",
    batch_size: int = 16,
    circuits_per_pass: int = SWEEP_CIRCUITS_PER_PASS,
    progress: Progress | None = None,
) -> SweepResult:
    """f of the top-k % circuits for every k, ranked by signed and by absolute score (`circuit_metrics`)."""
    circuits = [top_edges(graph, scores, k, absolute) for absolute in (False, True) for k in percents]
    result = circuit_metrics(view, graph, batch, circuits, ablation, batch_size, circuits_per_pass, progress)
    f, m, n = result.faithfulness.tolist(), result.m.tolist(), len(percents)
    return SweepResult(
        percents=tuple(percents), edges=tuple(int(c.sum()) for c in circuits[:n]),
        f_signed=tuple(f[:n]), f_absolute=tuple(f[n:]), m_signed=tuple(m[:n]), m_absolute=tuple(m[n:]),
        m_full=result.m_full, m_empty=result.m_empty,
    )  # fmt: skip


@dataclass(frozen=True)
class Spread:
    """Mean, sample sd (None for one value: undefined), min and max of a quantity over seeds."""

    mean: float
    sd: float | None
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        sd = statistics.stdev(values) if len(values) > 1 else None
        return cls(statistics.fmean(values), sd, min(values), max(values))


@dataclass(frozen=True)
class SeededSweeps:
    """The sweeps of one ranking drawn with each of `seeds` (the random baseline); one seed for any other ranking."""

    seeds: tuple[int, ...]
    sweeps: tuple[SweepResult, ...]

    @property
    def mean(self) -> SweepResult:
        """The mean curve: f and m per size averaged over seeds (the same pairs, so m(full) and m(empty) agree)."""
        first, n = self.sweeps[0], len(self.sweeps)

        def avg(values: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
            return tuple(sum(column) / n for column in zip(*values, strict=True))

        return SweepResult(
            percents=first.percents, edges=first.edges,
            f_signed=avg([s.f_signed for s in self.sweeps]), f_absolute=avg([s.f_absolute for s in self.sweeps]),
            m_signed=avg([s.m_signed for s in self.sweeps]), m_absolute=avg([s.m_absolute for s in self.sweeps]),
            m_full=first.m_full, m_empty=first.m_empty,
        )  # fmt: skip

    @property
    def cpr(self) -> Spread:
        return Spread.of([s.cpr for s in self.sweeps])

    @property
    def cmd(self) -> Spread:
        return Spread.of([s.cmd for s in self.sweeps])
