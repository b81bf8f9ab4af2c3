"""The circuit stage: score every edge of MIB's graph on MIB's arithmetic prompts, and sweep faithfulness.

Prompts are built in MIB's format (`data/mib_arithmetic.py`), `n_prompts` pairs kept where the model's top
token is the scored answer on the clean prompt and the counterfactual answer on the counterfactual prompt
(`circuits/prompts.py` says why both); fewer than `min_prompts` surviving is refused. Edges are ranked by EAP,
EAP-IG (`circuits/attribution.py`), by an identify run's node effects (`circuits/node_ranking.py`), or at random
(the baseline); or their scores are read back from an earlier circuit folder (`from_circuit`, with its prompts).
With `evaluate` the top k % circuits are evaluated exactly (`circuits/faithfulness.py`) and summarised by CPR and CMD;
`compare_methods` ranks the same prompts by further methods and sweeps them too, so 2024's node ranking and 2025's
edge scores meet on one protocol.
Writes edges.json (MIB's format; in_graph = the top `circuit_percent` % by signed score), prompts.jsonl,
oracle.csv (with `oracle` n: the exact scores of the top n edges by |score| and n random ones, next to the
method's; Spearman and top-n overlap in metadata.json), faithfulness.csv, cpr_cmd.csv (a row per method) and
faithfulness.png (with `evaluate`; the curves of the `compare` folders drawn beside this run's), circuit.svg
(the drawing, `drawn_circuit`), and metadata.json last.
"""

from __future__ import annotations

import csv
import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from arithmech.analysis.agreement import spearman
from arithmech.circuits.attribution import edge_scores
from arithmech.circuits.batch import CircuitBatch
from arithmech.circuits.circuit_file import EDGES_FILE, check_matches, graph_cfg, read_edges, write_edges
from arithmech.circuits.faithfulness import SweepResult, faithfulness_sweep, top_edges
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.node_ranking import node_edge_scores
from arithmech.circuits.oracle import exact_edge_scores, oracle_subset
from arithmech.circuits.prompts import FilterCounts, answered_pairs, circuit_batch, filter_answered
from arithmech.circuits.senders import check_edge_graph
from arithmech.data.io import read_prompt_file, write_prompt_file
from arithmech.data.mib_arithmetic import mib_pairs
from arithmech.data.mib_dataset import mib_dataset_pairs, read_mib_rows
from arithmech.data.prompts import PromptPair
from arithmech.errors import DataError
from arithmech.lineage import read_metadata
from arithmech.models.load import ModelHandle
from arithmech.patching.attribution import frozen_parameters
from arithmech.report.circuit_drawing import circuit_svg
from arithmech.report.circuit_plots import faithfulness_curves
from arithmech.runs import atomic_write_json, atomic_write_text, csv_text, git_sha, package_versions
from arithmech.stages.circuit_config import DRAWN_DEFAULT, DRAWN_MAX, IDENTIFY_METHOD, CircuitConfig
from arithmech.stages.identify_run import read_identify_run

logger = logging.getLogger(__name__)

DRAWING_FILE = "circuit.svg"
DRAWN_F = 0.8
"""The faithfulness of the circuit drawn by default: the smallest swept one that reaches it."""


@dataclass
class CircuitResult:
    out_dir: Path
    method: str
    n_edges: int
    n_prompts: int
    sweep: SweepResult | None
    oracle: dict[str, Any] | None = None
    filtered: list[FilterCounts] | None = None
    """What the answer filter kept, per operation (None: prompts read back, or kept unfiltered)."""
    compared: dict[str, SweepResult] | None = None
    """The sweeps of `compare_methods`."""


def mib_prompt_set(handle: ModelHandle, cfg: CircuitConfig) -> tuple[list[PromptPair], list[FilterCounts] | None]:
    """MIB pairs of each operation (n_prompts / operations each) that pass the answer filter, and its counts."""
    quota = math.ceil(cfg.n_prompts / len(cfg.operations))
    if cfg.mib_dataset is not None:
        return dataset_prompt_set(handle, cfg, quota)
    if cfg.keep_incorrect:
        pairs = [p for op in cfg.operations for p in mib_pairs(handle.tokenizer, op, quota, cfg.seed, cfg.max_operand)]
        return pairs[: cfg.n_prompts], None
    kept: list[PromptPair] = []
    counts: list[FilterCounts] = []
    for operation in cfg.operations:
        pairs, seen = answered_pairs(
            handle.view, handle.tokenizer, operation, quota, cfg.seed, cfg.max_operand, cfg.batch_size
        )
        logger.info("answer filter: %s", seen.describe())
        kept, counts = kept + pairs, [*counts, seen]
    check_enough(len(kept), counts, cfg)
    return kept[: cfg.n_prompts], counts


def dataset_prompt_set(
    handle: ModelHandle, cfg: CircuitConfig, quota: int
) -> tuple[list[PromptPair], list[FilterCounts] | None]:
    """The pairs of MIB's own data (`--mib-dataset`) of each operation, through the same answer filter."""
    assert cfg.mib_dataset is not None
    rows = read_mib_rows(cfg.mib_dataset, cfg.mib_split)
    kept: list[PromptPair] = []
    counts: list[FilterCounts] = []
    for operation in cfg.operations:
        pairs, unusable = mib_dataset_pairs(handle.tokenizer, rows, operation)
        source = f"{cfg.mib_dataset} ({operation})"
        if not pairs and not unusable:
            raise DataError(
                f"--mib-dataset {cfg.mib_dataset!r} has no {operation} rows (column operator); choose the operation "
                "its rows hold with --operations"
            )
        if cfg.keep_incorrect:
            kept += pairs[:quota]
            continue
        passed, seen = filter_answered(handle.view, handle.tokenizer, pairs, source, cfg.batch_size, want=quota)
        seen = replace(seen, unusable=unusable)
        logger.info("answer filter: %s", seen.describe())
        kept, counts = kept + passed, [*counts, seen]
    if cfg.keep_incorrect:
        return kept[: cfg.n_prompts], None
    check_enough(len(kept), counts, cfg)
    return kept[: cfg.n_prompts], counts


def check_enough(kept: int, counts: list[FilterCounts], cfg: CircuitConfig) -> None:
    """A DataError when fewer pairs than `min_prompts` (at most n_prompts) survive the answer filter."""
    need = min(cfg.min_prompts, cfg.n_prompts)
    if kept >= need:
        return
    seen = "; ".join(c.describe() for c in counts)
    raise DataError(
        f"only {kept} prompt pairs survive the answer filter (the model's top token must be the scored answer on "
        f"the clean prompt and the counterfactual answer on the counterfactual prompt), fewer than {need} ({seen}): "
        "try smaller operands (--max-operand 9), other prompts, a lower --min-prompts, or another model"
    )


def rank_edges(
    handle: ModelHandle, graph: CircuitGraph, batch: CircuitBatch, cfg: CircuitConfig, method: str
) -> torch.Tensor:
    """[receiver, sender] signed scores by `method`."""
    if method == "random":
        gen = torch.Generator().manual_seed(cfg.seed)
        return torch.randn(graph.n_receivers, graph.n_senders, generator=gen) * graph.valid
    if method == IDENTIFY_METHOD:
        assert cfg.identify_run is not None
        return node_edge_scores(graph, read_identify_run(cfg.identify_run, handle).effects)
    gradient = "eap" if method == "eap" else "eap-ig"
    with frozen_parameters(handle.model):  # gradients of the receivers' inputs only: no graph through the weights
        return edge_scores(handle.view, graph, batch, method=gradient, steps=cfg.steps, batch_size=cfg.batch_size)


def circuit(handle: ModelHandle, cfg: CircuitConfig, out_dir: str | Path, quiet: bool = False) -> CircuitResult:
    """Score the edges (or read their scores), optionally sweep faithfulness, and write the run folder."""
    start = time.perf_counter()
    view = handle.view
    check_edge_graph(view)
    graph = CircuitGraph.from_dims(handle.dims, view.parallel_residual)
    model_cfg = graph_cfg(graph, handle.dims.d_model, handle.dims.n_kv_heads)
    logger.info("graph: %d nodes, %d edges", len(graph.node_names), graph.n_edges)
    edges_path = cfg.edges_file()
    method = cfg.method
    filtered: list[FilterCounts] | None = None
    if edges_path is not None:
        stored = read_edges(edges_path)
        check_matches(stored, model_cfg, str(edges_path))
        pairs = read_prompt_file(edges_path.parent / "prompts.jsonl")
        earlier = read_metadata(edges_path.parent) or {}
        method = str(earlier.get("config", {}).get("method", "file"))
        scores = stored.scores.nan_to_num(0.0)
        batch = circuit_batch(handle.tokenizer, pairs)
        counts: dict[str, Any] = {"prompts": len(batch), "from": str(edges_path.parent)}
    else:
        pairs, filtered = mib_prompt_set(handle, cfg)
        batch = circuit_batch(handle.tokenizer, pairs)
        scores = rank_edges(handle, graph, batch, cfg, method)
        counts = {"prompts": len(batch)}
    scored_s = time.perf_counter() - start
    sweeps: dict[str, SweepResult] = {}
    if cfg.evaluate:
        ranked = {method: scores, **{m: rank_edges(handle, graph, batch, cfg, m) for m in cfg.compare_methods}}
        for name, ranking in ranked.items():
            sweeps[name] = faithfulness_sweep(view, graph, batch, ranking, cfg.percents, cfg.ablation, cfg.batch_size)  # type: ignore[arg-type]
        if abs(sweeps[method].m_full - sweeps[method].m_empty) < 1e-6:
            raise DataError("the clean and ablated runs give the same logit difference, so faithfulness is undefined")
    sweep = sweeps.get(method)
    oracle = oracle_rows(handle, graph, batch, scores, cfg) if cfg.oracle else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if oracle is not None:
        atomic_write_text(out / "oracle.csv", csv_text(oracle[0]))
    write_edges(out / EDGES_FILE, model_cfg, scores, top_edges(graph, scores, cfg.circuit_percent, absolute=False) > 0)
    write_prompt_file(out / "prompts.jsonl", pairs)
    title = f"{handle.source.get('model', 'model')}: {', '.join(cfg.operations)} (MIB format), {len(batch)} prompts"
    if sweeps:
        rows = [row for name, result in sweeps.items() for row in faithfulness_rows(name, result)]
        atomic_write_text(out / "faithfulness.csv", csv_text(rows))
        atomic_write_text(out / "cpr_cmd.csv", csv_text([summary_row(n, r, len(batch)) for n, r in sweeps.items()]))
        curves = {n: (r.percents, r.f_signed, r.f_absolute) for n, r in sweeps.items()}
        faithfulness_curves({**curves, **compared_curves(cfg.compare)}, out / "faithfulness.png", title)
    drawing = drawn_circuit(graph, scores, cfg.draw_percent, sweep)
    names = [(f"{graph.sender_names[s]}->{graph.receiver_names[r]}", float(scores[r, s])) for r, s in drawing.edges]
    svg = circuit_svg(names, graph.n_layers, graph.n_heads, title, f"{method}: {drawing.why}")
    atomic_write_text(out / DRAWING_FILE, svg)
    metadata: dict[str, Any] = {
        "stage": CircuitConfig.STAGE,
        "model": handle.source,
        "dims": asdict(handle.dims),
        "config": {**asdict(cfg), "method": method},
        "graph": {**model_cfg, "n_edges": graph.n_edges, "n_nodes": len(graph.node_names)},
        "counts": counts,
        "answer_filter": None if filtered is None else [c.as_dict() for c in filtered],
        "identify_runs": [] if cfg.identify_run is None else [read_identify_run(cfg.identify_run, handle).record],
        "drawing": {"edges": len(drawing.edges), "circuit_edges": drawing.circuit_edges, "why": drawing.why},
        "oracle": None if oracle is None else oracle[1],
        "seed": cfg.seed,
        "timings": {"scores_s": scored_s, "total_s": time.perf_counter() - start},
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(out / "metadata.json", metadata)
    return CircuitResult(
        out_dir=out, method=method, n_edges=graph.n_edges, n_prompts=len(batch), sweep=sweep,
        oracle=None if oracle is None else oracle[1], filtered=filtered,
        compared={n: r for n, r in sweeps.items() if n != method},
    )  # fmt: skip


@dataclass(frozen=True)
class Drawing:
    edges: list[tuple[int, int]]
    """(receiver, sender) of the drawn edges, the top by signed score."""
    circuit_edges: int
    """Edges of the circuit chosen; more than drawn when it exceeds DRAWN_MAX."""
    why: str


def drawn_circuit(
    graph: CircuitGraph, scores: torch.Tensor, percent: float | None, sweep: SweepResult | None
) -> Drawing:
    """The edges to draw: the top `percent` %; without it the smallest swept circuit with f >= DRAWN_F (signed
    ranking, as CPR's), else the top DRAWN_DEFAULT edges; at most the DRAWN_MAX strongest of them."""
    if percent is not None:
        n, why = max(1, int(percent / 100 * graph.n_edges)), f"top {percent:g} % of edges"
    else:
        reached = [(k, n) for k, n, f in zip(sweep.percents, sweep.edges, sweep.f_signed, strict=True)
                   if f >= DRAWN_F] if sweep is not None else []  # fmt: skip
        if reached:
            k, n = reached[0]
            why = f"smallest swept circuit with f >= {DRAWN_F:g} ({k:g} % of edges)"
        else:
            n, why = min(DRAWN_DEFAULT, graph.n_edges), f"top {min(DRAWN_DEFAULT, graph.n_edges)} edges"
    order = torch.sort(graph.to_edges(scores.float()), descending=True, stable=True).indices[: min(n, DRAWN_MAX)]
    edges = [(int(r), int(s)) for r, s in graph.edge_index[order].tolist()]
    if n > DRAWN_MAX:
        why += f", its {DRAWN_MAX} strongest drawn"
    return Drawing(edges=edges, circuit_edges=n, why=f"{why}: {len(edges)} edges")


def oracle_rows(
    handle: ModelHandle, graph: CircuitGraph, batch: CircuitBatch, scores: torch.Tensor, cfg: CircuitConfig
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Exact scores of the top n edges by |score| and n random ones; rows and agreement (Spearman, top-n overlap)."""
    edges = oracle_subset(graph, scores, cfg.oracle, cfg.seed)
    exact = exact_edge_scores(handle.view, graph, batch, edges, batch_size=cfg.batch_size).tolist()
    estimate = [float(scores[r, s]) for r, s in edges]
    rows = [
        {"edge": f"{graph.sender_names[s]}->{graph.receiver_names[r]}", "chosen": "top" if i < cfg.oracle else "random",
         "score": est, "exact": ex}
        for i, ((r, s), est, ex) in enumerate(zip(edges, estimate, exact, strict=True))
    ]  # fmt: skip
    n = cfg.oracle
    top_est = set(sorted(range(len(edges)), key=lambda i: -abs(estimate[i]))[:n])
    top_exact = set(sorted(range(len(edges)), key=lambda i: -abs(exact[i]))[:n])
    agreement = {
        "edges": len(edges),
        "spearman": spearman(estimate, exact),
        "top_n_overlap": len(top_est & top_exact) / n,
    }
    return rows, agreement


def compared_curves(folders: tuple[str, ...]) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """method -> (percents, f signed, f absolute) read from other circuit folders' faithfulness.csv."""
    curves: dict[str, tuple[list[float], list[float], list[float]]] = {}
    for folder in folders:
        with (Path(folder).expanduser() / "faithfulness.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        method = rows[0]["method"] if rows else Path(folder).name
        name = method if method not in curves else f"{method} ({Path(folder).name})"
        signed = [r for r in rows if r["ranking"] == "signed"]
        absolute = [float(r["f"]) for r in rows if r["ranking"] == "absolute"]
        curves[name] = ([float(r["percent"]) for r in signed], [float(r["f"]) for r in signed], absolute)
    return curves


def faithfulness_rows(method: str, sweep: SweepResult) -> list[dict[str, Any]]:
    rows = []
    for ranking, fs, ms in (
        ("signed", sweep.f_signed, sweep.m_signed),
        ("absolute", sweep.f_absolute, sweep.m_absolute),
    ):
        for k, n, f, m in zip(sweep.percents, sweep.edges, fs, ms, strict=True):
            rows.append({"method": method, "ranking": ranking, "percent": k, "edges": n, "f": f, "m": m})
    return rows


def summary_row(method: str, sweep: SweepResult, prompts: int) -> dict[str, Any]:
    return {"method": method, "cpr": sweep.cpr, "cmd": sweep.cmd, "m_full": sweep.m_full, "m_empty": sweep.m_empty,
            "prompts": prompts}  # fmt: skip
