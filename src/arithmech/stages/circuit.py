"""The circuit stage: score every edge of MIB's graph on find pairs, and sweep faithfulness on held-out test pairs.

Prompts are built in MIB's format (`data/mib_arithmetic.py`) or read from MIB's data (--mib-dataset), in two
disjoint sets (`stages/circuit_prompts.py`): `n_prompts` find pairs the edges are scored on and `test_prompts`
test pairs the circuits are evaluated on, as MIB finds circuits on its train split and evaluates them on
validation; each set keeps only pairs where the model's top token is the scored answer on the clean prompt and
the counterfactual answer on the counterfactual prompt (`circuits/prompts.py` says why both), and fewer than
`min_prompts` in either is refused before scoring. `in_sample` evaluates on the find pairs instead, and every
table, the figure, the drawing's title and metadata.json then say "in-sample".
Edges are ranked by EAP, EAP-IG (`circuits/attribution.py`), by an identify run's node effects
(`circuits/node_ranking.py`), or at random (the baseline, drawn with `random_seeds` seeds); or their scores are
read back from an earlier circuit folder (`from_circuit`, with its find and test pairs). With `evaluate` the top
k % circuits are evaluated exactly (`circuits/faithfulness.py`) on the test pairs and summarised by CPR and CMD;
`compare_methods` ranks the same find pairs by further methods and sweeps them too, so 2024's node ranking and
2025's edge scores meet on one protocol. `circuit_file` evaluates a circuit file of MIB's format made by another
tool: the circuit it marks in_graph, and the sweep by its scores where it scores every edge.
Writes edges.json (MIB's format, `circuits/circuit_file.py`; in_graph = the top `circuit_percent` % by signed
score), prompts.jsonl (find pairs) and test_prompts.jsonl (test pairs), oracle.csv (with `oracle` n: the exact
scores, on the find pairs, of the top n edges by |score| and n random ones, next to the method's; Spearman and
top-n overlap in metadata.json), faithfulness.csv, cpr_cmd.csv (a row per method; `stages/circuit_tables.py`
names their columns) and faithfulness.png (with `evaluate`; the curves of the `compare` folders drawn beside
this run's), file_circuit.csv (with `circuit_file`), circuit.svg (the drawing, `drawn_circuit`), and
metadata.json last.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech.analysis.agreement import spearman
from arithmech.circuits.attribution import edge_scores
from arithmech.circuits.batch import CircuitBatch
from arithmech.circuits.circuit_file import EDGES_FILE, graph_cfg, read_edges, write_edges
from arithmech.circuits.faithfulness import SeededSweeps, SweepResult, circuit_metrics, faithfulness_sweep, top_edges
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.node_ranking import node_edge_scores
from arithmech.circuits.oracle import exact_edge_scores, oracle_subset
from arithmech.circuits.prompts import FilterCounts, circuit_batch
from arithmech.circuits.senders import check_edge_graph
from arithmech.data.io import write_prompt_file
from arithmech.errors import DataError
from arithmech.lineage import read_metadata
from arithmech.models.load import ModelHandle
from arithmech.patching.attribution import frozen_parameters
from arithmech.progress import progress_bar
from arithmech.report.circuit_drawing import circuit_svg
from arithmech.report.circuit_plots import faithfulness_curves
from arithmech.runs import atomic_write_json, atomic_write_text, csv_text, git_sha, package_versions
from arithmech.stages.circuit_config import (
    DRAWN_DEFAULT,
    DRAWN_MAX,
    IDENTIFY_METHOD,
    SCORING_SETTINGS,
    TEST_PROMPTS_FILE,
    CircuitConfig,
)
from arithmech.stages.circuit_prompts import PromptSplit, prompt_split, stored_split
from arithmech.stages.circuit_tables import compared_curves, faithfulness_rows, file_circuit_row, summary_row
from arithmech.stages.identify_run import read_identify_run

logger = logging.getLogger(__name__)

DRAWING_FILE = "circuit.svg"
FILE_METHOD = "file"
"""The method name of a circuit read with `circuit_file` (its rows in faithfulness.csv and cpr_cmd.csv)."""
DRAWN_F = 0.8
"""The faithfulness of the circuit drawn by default: the smallest swept one that reaches it."""


@dataclass
class CircuitResult:
    out_dir: Path
    method: str
    n_edges: int
    n_prompts: int
    """Find pairs (the edges were scored on them; 0 for a circuit file)."""
    sweep: SweepResult | None
    """The method's curve (for the random ranking, the mean over seeds)."""
    oracle: dict[str, Any] | None = None
    filtered: dict[str, list[FilterCounts]] | None = None
    """What the answer filter kept, per set ("find", "test") and operation (None: read back, or kept unfiltered)."""
    compared: dict[str, SweepResult] | None = None
    """The curves of `compare_methods`."""
    summary: list[dict[str, Any]] | None = None
    """cpr_cmd.csv's rows: per method CPR and CMD (mean and spread over seeds for the random ranking)."""
    pairs: str = ""
    """Which pairs the circuits were evaluated on: "held-out" or "in-sample"."""
    n_test: int | None = None
    """Pairs the circuits were evaluated on."""
    file_circuit: dict[str, Any] | None = None
    """With `circuit_file`: f of the circuit the file marks (file_circuit.csv's row)."""


def random_scores(graph: CircuitGraph, seed: int) -> torch.Tensor:
    """[receiver, sender] a random ranking: standard normal scores drawn with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(graph.n_receivers, graph.n_senders, generator=gen) * graph.valid


def rank_edges(
    handle: ModelHandle, graph: CircuitGraph, batch: CircuitBatch, cfg: CircuitConfig, method: str, quiet: bool = True
) -> torch.Tensor:
    """[receiver, sender] signed scores by `method` (on the find pairs `batch`; random: the first seed)."""
    if method == "random":
        return random_scores(graph, cfg.seed)
    if method == IDENTIFY_METHOD:
        assert cfg.identify_run is not None
        return node_edge_scores(graph, read_identify_run(cfg.identify_run, handle).effects)
    gradient = "eap" if method == "eap" else "eap-ig"
    # gradients of the receivers' inputs only: no graph through the weights
    with frozen_parameters(handle.model), progress_bar(f"scoring edges ({method})", "pass", quiet) as bar:
        scores = edge_scores(handle.view, graph, batch, method=gradient, steps=cfg.steps, batch_size=cfg.batch_size,
                             progress=bar)  # fmt: skip
    check_finite_scores(graph, scores, method, str(handle.model.dtype).removeprefix("torch."))
    return scores


def check_finite_scores(graph: CircuitGraph, scores: torch.Tensor, method: str, dtype: str) -> None:
    """Refuse edge scores that are not all finite (a 16-bit overflow in the model's own passes, a broken
    checkpoint): a ranking with inf or NaN in it would choose its circuits silently wrong."""
    bad = int((~scores.isfinite() & graph.valid.bool()).sum())
    if not bad:
        return
    found = f"{method} gave {bad} of {int(graph.valid.sum())} edge scores that are not finite with the model in {dtype}"
    if dtype in ("float32", "float64"):
        raise DataError(f"{found}: its own forward or backward pass gives inf or NaN; check the checkpoint's weights")
    raise DataError(f"{found} (an overflow of its activations or gradients); load it in float32 (--dtype float32)"
                    + (" or bfloat16 (--dtype bfloat16)" if dtype == "float16" else ""))


def sweep_rankings(
    handle: ModelHandle,
    graph: CircuitGraph,
    find: CircuitBatch | None,
    test: CircuitBatch,
    cfg: CircuitConfig,
    rankings: dict[str, torch.Tensor | None],
    quiet: bool = True,
) -> dict[str, SeededSweeps]:
    """The sweep of each ranking on the test pairs (None: scored on the find pairs now); the random ranking once
    per seed (`random_seeds` seeds from `seed`)."""
    sweeps: dict[str, SeededSweeps] = {}
    for name, scores in rankings.items():
        seeds = tuple(cfg.seed + i for i in range(cfg.random_seeds)) if name == "random" else ()
        if seeds:
            drawn = [random_scores(graph, seed) for seed in seeds]
        else:
            if scores is None:
                assert find is not None, "a ranking scored now needs find pairs"
                scores = rank_edges(handle, graph, find, cfg, name, quiet)
            drawn = [scores]
        runs = []
        for i, ranking in enumerate(drawn):
            seed = f", seed {seeds[i]}" if seeds else ""
            with progress_bar(f"sweep of {len(cfg.percents)} sizes ({name}{seed})", "circuit", quiet) as bar:
                runs.append(faithfulness_sweep(handle.view, graph, test, ranking, cfg.percents, cfg.ablation,  # type: ignore[arg-type]
                                               cfg.batch_size, progress=bar))  # fmt: skip
        sweeps[name] = SeededSweeps(seeds, tuple(runs))
    return sweeps


def circuit(handle: ModelHandle, cfg: CircuitConfig, out_dir: str | Path, quiet: bool = False) -> CircuitResult:
    """Score the edges on the find pairs (or read their scores), optionally sweep faithfulness on the test pairs,
    and write the run folder."""
    start = time.perf_counter()
    view = handle.view
    check_edge_graph(view)
    graph = CircuitGraph.from_dims(handle.dims, view.parallel_residual)
    model_cfg = graph_cfg(graph, handle.dims.d_model)
    logger.info("graph: %d nodes, %d edges", len(graph.node_names), graph.n_edges)
    method, marked, scores, file_scored = str(cfg.method), None, None, False
    source: dict[str, Any] = {}  # --from's metadata.json: how its scores and pairs were made, kept in this record
    edges_path = cfg.edges_file()
    if cfg.circuit_file is not None:
        stored = read_edges(cfg.circuit_file, model_cfg)
        method, marked, scores, file_scored = FILE_METHOD, stored.in_graph, stored.scores, stored.fully_scored
        split = prompt_split(handle, cfg, quiet)
    elif edges_path is not None:
        scores = read_edges(edges_path, model_cfg).scores
        source = read_metadata(edges_path.parent) or {}
        split = stored_split(edges_path.parent, cfg, source.get("evaluation") or {})
        method = str(source.get("config", {}).get("method", FILE_METHOD))
    else:
        split = prompt_split(handle, cfg, quiet)
    find = circuit_batch(handle.tokenizer, split.find) if split.find else None
    if scores is None:
        assert find is not None, "a new run has find pairs"
        scores = rank_edges(handle, graph, find, cfg, method, quiet)
    scores = scores.nan_to_num(0.0)  # an edge a file does not score: 0
    scored_s = time.perf_counter() - start
    evaluated = split.evaluated
    test = circuit_batch(handle.tokenizer, evaluated) if evaluated is not None else None
    sweeps: dict[str, SeededSweeps] = {}
    file_row = None
    if test is not None and marked is not None:
        with progress_bar("the file's circuit", "circuit", quiet) as bar:
            metrics = circuit_metrics(view, graph, test, [marked.float()], cfg.ablation, cfg.batch_size,  # type: ignore[arg-type]
                                      progress=bar)  # fmt: skip
        file_row = file_circuit_row(str(cfg.circuit_file), metrics, marked, graph.n_edges, len(test), split.label)
        if file_scored:
            sweeps = sweep_rankings(handle, graph, None, test, cfg, {method: scores}, quiet)
    elif cfg.evaluate and test is not None:
        rankings: dict[str, torch.Tensor | None] = {method: scores, **dict.fromkeys(cfg.compare_methods)}
        sweeps = sweep_rankings(handle, graph, find, test, cfg, rankings, quiet)
    if sweeps and abs(sweeps[method].sweeps[0].m_full - sweeps[method].sweeps[0].m_empty) < 1e-6:
        raise DataError("the clean and ablated runs give the same logit difference, so faithfulness is undefined")
    sweep = sweeps[method].mean if method in sweeps else None
    oracle = oracle_rows(handle, graph, find, scores, cfg, quiet) if cfg.oracle and find is not None else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if oracle is not None:
        atomic_write_text(out / "oracle.csv", csv_text(oracle[0]))
    in_graph = None
    if marked is None:
        kept = top_edges(graph, scores, cfg.circuit_percent, absolute=cfg.circuit_ranking == "absolute") > 0
        write_edges(out / EDGES_FILE, model_cfg, scores, kept)
        in_graph = {"percent": cfg.circuit_percent, "ranking": cfg.circuit_ranking, "edges": int(kept.sum()),
                    "rule": f"the top {cfg.circuit_percent:g} % of edges by "
                            f"{'signed score' if cfg.circuit_ranking == 'signed' else '|score|'}"}  # fmt: skip
    if split.find:
        write_prompt_file(out / "prompts.jsonl", split.find)
    if split.test is not None:
        write_prompt_file(out / TEST_PROMPTS_FILE, split.test)
    settings = {**asdict(cfg), "method": method, **scoring_settings(source)}
    title = run_title(handle, cfg, split, method, settings["operations"])
    summary = [summary_row(n, r, split.label, len(test or ())) for n, r in sweeps.items()]
    if sweeps:
        rows = [row for name, result in sweeps.items() for row in faithfulness_rows(name, result, split.label)]
        atomic_write_text(out / "faithfulness.csv", csv_text(rows))
        atomic_write_text(out / "cpr_cmd.csv", csv_text(summary))
        curves = {n: (list(r.mean.percents), list(r.mean.f_signed), list(r.mean.f_absolute)) for n, r in sweeps.items()}
        faithfulness_curves({**curves, **compared_curves(cfg.compare)}, out / "faithfulness.png", title)
    if file_row is not None:
        atomic_write_text(out / "file_circuit.csv", csv_text([file_row]))
    drawing = drawn_circuit(graph, scores, cfg.draw_percent, sweep, marked)
    names = [(f"{graph.sender_names[s]}->{graph.receiver_names[r]}", float(scores[r, s])) for r, s in drawing.edges]
    svg = circuit_svg(names, graph.n_layers, graph.n_heads, title, f"{method}: {drawing.why}")
    atomic_write_text(out / DRAWING_FILE, svg)
    metadata: dict[str, Any] = {
        "stage": CircuitConfig.STAGE,
        "model": handle.source,
        "dims": asdict(handle.dims),
        "config": settings,
        "graph": {**model_cfg, "n_key_value_heads": handle.dims.n_kv_heads, "n_edges": graph.n_edges,
                  "n_nodes": len(graph.node_names)},  # fmt: skip
        "counts": {"find_pairs": len(split.find), "test_pairs": None if split.test is None else len(split.test),
                   **({"from": str(edges_path.parent)} if edges_path is not None else {})},  # fmt: skip
        "evaluation": split.record(),
        "answer_filter": source.get("answer_filter") if split.filtered is None else {
            part: [c.as_dict() for c in counts] for part, counts in split.filtered.items()
        },
        "identify_runs": [*source.get("identify_runs", []),
                          *([] if cfg.identify_run is None else [read_identify_run(cfg.identify_run, handle).record])],
        "scored": None if edges_path is None else {
            "folder": str(edges_path.parent), **{k: source.get(k) for k in ("created", "git_sha")},
            "scores_s": (source.get("timings") or {}).get("scores_s"),
        },
        "in_graph": in_graph,
        "drawing": {"edges": len(drawing.edges), "circuit_edges": drawing.circuit_edges, "why": drawing.why},
        "oracle": None if oracle is None else {**oracle[1], "pairs": "find"},
        "file_circuit": file_row,
        "seed": cfg.seed,
        "timings": {"scores_s": scored_s, "total_s": time.perf_counter() - start},
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(out / "metadata.json", metadata)
    return CircuitResult(
        out_dir=out, method=method, n_edges=graph.n_edges, n_prompts=len(split.find), sweep=sweep,
        oracle=None if oracle is None else oracle[1], filtered=split.filtered,
        compared={n: r.mean for n, r in sweeps.items() if n != method}, summary=summary, pairs=split.label,
        n_test=None if test is None else len(test), file_circuit=file_row,
    )  # fmt: skip


def scoring_settings(source: dict[str, Any]) -> dict[str, Any]:
    """The settings that made a --from folder's pairs and scores, as its metadata.json recorded them (this run uses
    them, not its own: `SCORING_SETTINGS`); {} for edges scored here."""
    recorded = source.get("config") or {}
    return {name: recorded[name] for name in SCORING_SETTINGS if name in recorded}


def run_title(
    handle: ModelHandle, cfg: CircuitConfig, split: PromptSplit, method: str, operations: Sequence[str]
) -> str:
    """The figure's and the drawing's title: the model, the task and which pairs the circuits were evaluated on."""
    task = f"{handle.source.get('model', 'model')}: {', '.join(operations)} (MIB format)"
    if method == FILE_METHOD:
        return f"{task}, circuit file {Path(str(cfg.circuit_file)).name}, {len(split.test or ())} held-out pairs"
    if split.in_sample:
        return f"{task}, IN-SAMPLE: scored and evaluated on the same {len(split.find)} pairs"
    held = f", evaluated on {len(split.test)} held-out pairs" if split.test is not None else ""
    return f"{task}, scored on {len(split.find)} pairs{held}"


@dataclass(frozen=True)
class Drawing:
    edges: list[tuple[int, int]]
    """(receiver, sender) of the drawn edges, the top by signed score."""
    circuit_edges: int
    """Edges of the circuit chosen; more than drawn when it exceeds DRAWN_MAX."""
    why: str


def drawn_circuit(
    graph: CircuitGraph,
    scores: torch.Tensor,
    percent: float | None,
    sweep: SweepResult | None,
    marked: torch.Tensor | None = None,
) -> Drawing:
    """The edges to draw: the top `percent` %; without it the circuit a circuit file marks (`marked`), else the
    smallest swept circuit with f >= DRAWN_F (signed ranking, as CPR's), else the top DRAWN_DEFAULT edges; at most
    the DRAWN_MAX strongest of them (by signed score)."""
    values = graph.to_edges(scores.float())
    if percent is not None:
        n, why = max(1, int(percent / 100 * graph.n_edges)), f"top {percent:g} % of edges"
    elif marked is not None:
        kept = graph.to_edges(marked.bool())
        values = torch.where(kept, values, float("-inf"))
        n, why = int(kept.sum()), "the circuit the file marks in_graph"
    else:
        reached = [(k, n) for k, n, f in zip(sweep.percents, sweep.edges, sweep.f_signed, strict=True)
                   if f >= DRAWN_F] if sweep is not None else []  # fmt: skip
        if reached:
            k, n = reached[0]
            why = f"smallest swept circuit with f >= {DRAWN_F:g} ({k:g} % of edges)"
        else:
            n, why = min(DRAWN_DEFAULT, graph.n_edges), f"top {min(DRAWN_DEFAULT, graph.n_edges)} edges"
    order = torch.sort(values, descending=True, stable=True).indices[: min(n, DRAWN_MAX)]
    edges = [(int(r), int(s)) for r, s in graph.edge_index[order].tolist()]
    if n > DRAWN_MAX:
        why += f", its {DRAWN_MAX} strongest drawn"
    return Drawing(edges=edges, circuit_edges=n, why=f"{why}: {len(edges)} edges")


def oracle_rows(
    handle: ModelHandle, graph: CircuitGraph, batch: CircuitBatch, scores: torch.Tensor, cfg: CircuitConfig,
    quiet: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Exact scores of the top n edges by |score| and n random ones; rows and agreement (Spearman, top-n overlap)."""
    edges = oracle_subset(graph, scores, cfg.oracle, cfg.seed)
    with progress_bar("oracle: exact edge scores", "edge", quiet) as bar:
        exact = exact_edge_scores(handle.view, graph, batch, edges, batch_size=cfg.batch_size, progress=bar).tolist()
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
