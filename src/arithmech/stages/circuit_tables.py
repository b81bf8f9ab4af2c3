"""The circuit stage's tables: faithfulness.csv, cpr_cmd.csv and file_circuit.csv rows, and the curves of --compare.

Every row says which pairs its numbers come from (`pairs`: "held-out", the test pairs, or "in-sample", the pairs the
edges were scored on) and which ranking: faithfulness.csv's `ranking` ("signed": top edges by score, CPR's;
"absolute": by |score|, CMD's), cpr_cmd.csv's `cpr_ranking` and `cmd_ranking` (MIB's convention,
`circuits/faithfulness.py`). The random ranking is swept once per seed: its faithfulness.csv rows with `draw`
"mean" are the mean f per size over the seeds, those with `draw` "seed N" one seed's; its cpr_cmd.csv row gives
the mean CPR and CMD over the seeds, their sd, min and max, and the seeds. Other rankings leave `draw`, the seeds
and the spread empty.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch

from arithmech.circuits.faithfulness import CircuitMetrics, SeededSweeps, SweepResult
from arithmech.stages.circuit_prompts import IN_SAMPLE

CPR_RANKING, CMD_RANKING = "signed", "absolute"
"""The rankings CPR and CMD are computed over (faithfulness.csv's `ranking` values)."""
SPREAD = ("sd", "min", "max")
EMPTY_PERCENT = 0.0
"""faithfulness.csv's row of the empty circuit (every edge ablated): f = 0, m = m(empty)."""

Curve = tuple[list[float], list[float], list[float]]
"""(percents, f with the signed ranking, f with the absolute ranking)."""


def curve_rows(method: str, sweep: SweepResult, pairs: str, draw: str = "") -> list[dict[str, Any]]:
    """faithfulness.csv rows of one curve: signed ranking first, then absolute, each from the empty circuit (0 %:
    no edge kept, m = m(empty), f = 0 by definition) through every swept size, so the curve is whole in one file."""
    rows = []
    for ranking, fs, ms in ((CPR_RANKING, sweep.f_signed, sweep.m_signed), (CMD_RANKING, sweep.f_absolute,
                                                                              sweep.m_absolute)):  # fmt: skip
        empty = [(EMPTY_PERCENT, 0, 0.0, sweep.m_empty)] if EMPTY_PERCENT not in sweep.percents else []
        for k, n, f, m in [*empty, *zip(sweep.percents, sweep.edges, fs, ms, strict=True)]:
            rows.append({"method": method, "pairs": pairs, "ranking": ranking, "draw": draw, "percent": k, "edges": n,
                         "f": f, "m": m})  # fmt: skip
    return rows


def faithfulness_rows(method: str, seeded: SeededSweeps, pairs: str) -> list[dict[str, Any]]:
    """A ranking's faithfulness.csv rows: its curve; for a seeded one the mean curve, then each seed's."""
    if not seeded.seeds:
        return curve_rows(method, seeded.sweeps[0], pairs)
    rows = curve_rows(method, seeded.mean, pairs, "mean")
    for seed, sweep in zip(seeded.seeds, seeded.sweeps, strict=True):
        rows += curve_rows(method, sweep, pairs, f"seed {seed}")
    return rows


def summary_row(method: str, seeded: SeededSweeps, pairs: str, prompts: int) -> dict[str, Any]:
    """A ranking's cpr_cmd.csv row (for a seeded one: the mean over seeds and the spread)."""
    cpr, cmd, first = seeded.cpr, seeded.cmd, seeded.sweeps[0]
    row: dict[str, Any] = {"method": method, "pairs": pairs, "prompts": prompts, "cpr": cpr.mean,
                           "cpr_ranking": CPR_RANKING, "cmd": cmd.mean, "cmd_ranking": CMD_RANKING,
                           "m_full": first.m_full, "m_empty": first.m_empty,
                           "seeds": " ".join(str(s) for s in seeded.seeds)}  # fmt: skip
    for name, spread in (("cpr", cpr), ("cmd", cmd)):
        row |= {f"{name}_{key}": getattr(spread, key) if seeded.seeds else None for key in SPREAD}
    return row


def file_circuit_row(source: str, metrics: CircuitMetrics, keep: torch.Tensor, n_edges: int, prompts: int,
                     pairs: str) -> dict[str, Any]:  # fmt: skip
    """file_circuit.csv: f of the circuit a circuit file marks in_graph, with m(C), m(full) and m(empty)."""
    edges = int(keep.sum())
    return {"source": source, "pairs": pairs, "prompts": prompts, "edges": edges, "percent": 100 * edges / n_edges,
            "f": float(metrics.faithfulness[0]), "m": float(metrics.m[0]), "m_full": metrics.m_full,
            "m_empty": metrics.m_empty}  # fmt: skip


def one_curve(rows: list[dict[str, str]]) -> bool:
    """Whether a faithfulness.csv row belongs to its method's curve (not one seed's of the random ranking)."""
    return not rows or rows[0].get("draw", "") in ("", "mean")


def compared_curves(folders: tuple[str, ...]) -> dict[str, Curve]:
    """method -> curve, read from other circuit folders' faithfulness.csv; a curve evaluated in-sample (so is every
    folder written before held-out evaluation, whose rows name no pairs) is labelled so."""
    curves: dict[str, Curve] = {}
    for folder in folders:
        with (Path(folder).expanduser() / "faithfulness.csv").open() as handle:
            rows = [r for r in csv.DictReader(handle) if one_curve([r]) and float(r["percent"]) > EMPTY_PERCENT]
        method = rows[0]["method"] if rows else Path(folder).name
        if rows and rows[0].get("pairs", IN_SAMPLE) == IN_SAMPLE:
            method += f" ({IN_SAMPLE})"
        name = method if method not in curves else f"{method} ({Path(folder).name})"
        signed = [r for r in rows if r["ranking"] == CPR_RANKING]
        absolute = [float(r["f"]) for r in rows if r["ranking"] == CMD_RANKING]
        curves[name] = ([float(r["percent"]) for r in signed], [float(r["f"]) for r in signed], absolute)
    return curves
