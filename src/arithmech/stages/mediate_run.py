"""The mediate run folder: its tables and figures written from a `MediateResult`, and read back for reports.

A folder is finished when its metadata.json exists (written last). Tables hold one number per cell with 9
significant digits (float32 round-trips exactly); an undefined value (NaN in memory: a class a task lacks,
e.g. operand2 for facts; number accuracy of facts) is an empty cell, read back as NaN. Medians follow torch:
the lower middle value for an even count.
"""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from arithmech.data.mediation_tokens import POSITION_CLASSES
from arithmech.errors import ConfigError
from arithmech.patching.mediation import top_neurons
from arithmech.runs import atomic_write_json, atomic_write_text, cell, csv_text, defined

if TYPE_CHECKING:
    from arithmech.stages.mediate import MediateResult
    from arithmech.stages.mediate_config import MediateConfig

STATISTICS: tuple[str, ...] = ("mean", "median")
BY_CLASS_FIELDS = ("task", "component", "layer", "class", "mean_ie", "median_ie", "n_pairs")
TOTAL_FIELDS = (
    "task", "intervention", "pairs", "considered", "rejected_length_mismatch", "rejected_same_result_token",
    "mean_te", "median_te", "number_accuracy",
)  # fmt: skip


def _num(value: float) -> str:
    return cell(defined(float(value)), ".9g")


def _read_num(text: str) -> float:
    return float(text) if text else np.nan


def by_class_rows(task: str, result: Any) -> list[dict[str, Any]]:
    """One row per (component, layer, class) of a `MediationResult`: mean and median IE over pairs."""
    mean, median = result.by_class("mean"), result.by_class("median")  # each [component, layer, class]
    n_pairs = (~result.per_pair_by_class().isnan()).sum(0)  # [component, layer, class]
    return [
        {"task": task, "component": component, "layer": layer, "class": name, "mean_ie": _num(mean[c, li, k]),
         "median_ie": _num(median[c, li, k]), "n_pairs": int(n_pairs[c, li, k])}
        for c, component in enumerate(result.components)
        for li, layer in enumerate(result.layers)
        for k, name in enumerate(POSITION_CLASSES)
    ]  # fmt: skip


def write_mediate_outputs(result: MediateResult, cfg: MediateConfig) -> None:
    """Write every table and figure, metadata.json last, then drop the saved partial results."""
    from arithmech.report.mediation_plots import mediation_heatmaps

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)  # the folder is unfinished until the new one is written
    atomic_write_text(
        out / "mediation_by_class.csv",
        csv_text([row for task, r in result.results.items() for row in by_class_rows(task, r)], BY_CLASS_FIELDS),
    )
    totals = []
    for task, r in result.results.items():
        te = r.total_effect
        totals.append(
            {"task": task, "intervention": cfg.intervention, **result.counts[task], "mean_te": _num(te.mean()),
             "median_te": _num(te.nanmedian()), "number_accuracy": _num(r.number_accuracy())}
        )  # fmt: skip
    atomic_write_text(out / "mediation_total.csv", csv_text(totals, TOTAL_FIELDS))
    k, layer = cfg.neuron_k, result.neuron_layer
    top = [
        {"task": task, "rank": rank + 1, "neuron": n, "mean_ie": _num(ie.nanmean(0)[n])}
        for task, ie in result.neurons.items()
        for rank, n in enumerate(top_neurons(ie, k))
    ]
    atomic_write_text(out / "neuron_top.csv", csv_text(top, ("task", "rank", "neuron", "mean_ie")))
    overlap = [
        {"task_a": a, "task_b": b, "layer": layer, "k": k, "overlap": _num(v)} for (a, b), v in result.overlaps.items()
    ]
    atomic_write_text(out / "neuron_overlap.csv", csv_text(overlap, ("task_a", "task_b", "layer", "k", "overlap")))
    lines = [json.dumps(item.pair.to_dict()) for task_items in result.items.values() for item in task_items]
    atomic_write_text(out / "pairs.jsonl", "\n".join(lines) + "\n")
    model = result.metadata.get("model", {}).get("model", "?")
    layers = next(iter(result.results.values())).layers
    n_pairs = {task: len(v) for task, v in result.items.items()}
    for statistic in STATISTICS:
        tables = {task: r.by_class(statistic).numpy() for task, r in result.results.items()}
        title = f"{statistic} indirect effect, {cfg.intervention} pairs: {model}"
        mediation_heatmaps(tables, cfg.components, layers, out / f"mediation_{statistic}.png", title, n_pairs,
                           label=f"{statistic} IE over pairs")  # fmt: skip
    atomic_write_json(out / "metadata.json", result.metadata)
    shutil.rmtree(out / ".partial", ignore_errors=True)


@dataclass(frozen=True)
class MediationRun:
    """What a mediate run left on disk: the by-class tables as arrays, the totals and the neuron overlaps."""

    path: Path
    tasks: tuple[str, ...]
    components: tuple[str, ...]
    layers: tuple[int, ...]
    mean: dict[str, np.ndarray]
    """task -> mean IE over pairs [component, layer, class] (classes in POSITION_CLASSES order)."""
    median: dict[str, np.ndarray]
    """task -> median IE over pairs [component, layer, class]."""
    n_pairs: dict[str, np.ndarray]
    """task -> pairs that have each class [class]."""
    totals: dict[str, dict[str, str]]
    """task -> its row of mediation_total.csv."""
    overlaps: dict[tuple[str, str], float]
    metadata: dict[str, Any]

    def table(self, task: str, statistic: str = "mean") -> np.ndarray:
        """[component, layer, class] IE of one task, "mean" or "median" over pairs."""
        if statistic not in STATISTICS or task not in self.tasks:
            raise ConfigError(f"ask for a task among {', '.join(self.tasks)} and a statistic among mean, median")
        return (self.mean if statistic == "mean" else self.median)[task]


def read_mediation_run(run_dir: str | Path) -> MediationRun:
    """Read a finished mediate run folder."""
    path = Path(run_dir)
    if not (path / "metadata.json").is_file():
        raise ConfigError(f"{str(path)!r} has no metadata.json, so it is no finished mediate run; give a mediate --out")
    metadata = json.loads((path / "metadata.json").read_text())
    if metadata.get("stage") != "mediate":
        raise ConfigError(f"run folder {str(path)!r} is a {metadata.get('stage')!r} run, not a mediate run")
    with (path / "mediation_by_class.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    tasks = tuple(dict.fromkeys(r["task"] for r in rows))
    components = tuple(dict.fromkeys(r["component"] for r in rows))
    layers = tuple(dict.fromkeys(int(r["layer"]) for r in rows))
    shape = (len(components), len(layers), len(POSITION_CLASSES))
    mean = {t: np.full(shape, np.nan) for t in tasks}
    median = {t: np.full(shape, np.nan) for t in tasks}
    n_pairs = {t: np.zeros(len(POSITION_CLASSES), dtype=int) for t in tasks}
    for r in rows:
        at = (components.index(r["component"]), layers.index(int(r["layer"])), POSITION_CLASSES.index(r["class"]))
        mean[r["task"]][at] = _read_num(r["mean_ie"])
        median[r["task"]][at] = _read_num(r["median_ie"])
        n_pairs[r["task"]][at[2]] = int(r["n_pairs"])
    with (path / "mediation_total.csv").open() as handle:
        totals = {r["task"]: r for r in csv.DictReader(handle)}
    with (path / "neuron_overlap.csv").open() as handle:
        overlaps = {(r["task_a"], r["task_b"]): _read_num(r["overlap"]) for r in csv.DictReader(handle)}
    return MediationRun(path, tasks, components, layers, mean, median, n_pairs, totals, overlaps, metadata)
