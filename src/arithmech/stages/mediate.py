"""The mediate stage: causal mediation analysis of arithmetic vs number retrieval vs factual recall.

Background
    Stolfo et al. (2023) ask which components carry an arithmetic result, and whether they are specific to
    arithmetic. For every task (an operation, number retrieval, factual knowledge) this stage generates
    base/alternative prompt pairs of one intervention type (`data/mediation_generate.py`), measures the
    indirect effect (IE) of every MLP and attention output at every layer and position
    (`patching/mediation.py`; METHODS.md sec. 5), and reduces it to [component, layer, position class] by
    averaging over a class's positions, then taking the mean (Stolfo et al.'s) and the median over pairs.
    At one MLP layer it also measures each neuron's IE at the last token and compares the top-k neurons of
    every two tasks (overlap |A ∩ B| / k): a low overlap between arithmetic and the comparison tasks means
    those neurons are specific to arithmetic.

Choices
    - Each task keeps `n_pairs` pairs, taken in turn from each of its templates with the formats
      interleaved, so a small n still covers every format. Pairs the tokenizer rejects (an alternative of
      another token length, or r and r' sharing a first token) are skipped and counted.
    - Every pair is used whether or not the model answers it (as Stolfo et al.); the number-token accuracy
      is reported beside the effects.
    - `neuron_layer=None` picks the layer whose MLP at the last token has the largest median IE on the first
      arithmetic task of `tasks` (the first task if none is arithmetic): where the result is written.

Outputs (each atomic; metadata.json last)
    mediation_by_class.csv   task, component, layer, class, mean_ie, median_ie, n_pairs (pairs with the class)
    mediation_total.csv      per task: pairs used / considered / rejected, mean and median TE, number accuracy
    neuron_top.csv           task, rank, neuron, mean_ie (top-k neurons of the neuron layer)
    neuron_overlap.csv       task_a, task_b, layer, k, overlap (every ordered pair, the diagonal included)
    mediation_mean.png, mediation_median.png, pairs.jsonl (the pairs used), metadata.json

Resume
    Each task's finished effects are saved in out/.partial/<task>-<key>.pt (key: a hash of the model, the
    settings that change the numbers, the token ids and the code version); a rerun into the same folder reuses
    them, and the folder is removed when the run completes.

Several processes (`accelerate launch`)
    Every process builds all pairs; each measures a contiguous slice of every task's pairs (saved as
    <task>-mediation-pairs<lo>-<hi>-<key>.pt), and the per-pair results are gathered in pair order, so every
    process holds exactly what one process computes (pairs are independent forward passes). Rank 0 writes.

Usage
    >>> result = mediate(handle, MediateConfig(tasks=("addition", "retrieval", "factual")), "runs/mediate")
    >>> read_mediation_run("runs/mediate").mean["addition"]     # [component, layer, class]

Reference: Stolfo, Belinkov, Sachan, EMNLP 2023 (arXiv 2305.15054), sec. 3-4.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from functools import partial
from itertools import zip_longest
from pathlib import Path
from typing import Any

import torch

from arithmech import distributed
from arithmech.data.mediation_generate import generate_mediation_pairs
from arithmech.data.mediation_prompts import MediationPair
from arithmech.data.mediation_tokens import POSITION_CLASSES, TokenizedMediationPair, tokenize_mediation_pairs
from arithmech.data.templates import OPERATIONS
from arithmech.errors import ConfigError, DataError
from arithmech.models.context import check_fits_context
from arithmech.models.load import ModelHandle
from arithmech.patching.mediation import (
    MediationResult,
    mediation_effects,
    neuron_effects,
    neuron_overlap,
)
from arithmech.runs import atomic_open, code_version, git_sha, package_versions
from arithmech.stages.mediate_config import MediateConfig
from arithmech.stages.mediate_run import MediationRun, read_mediation_run, write_mediate_outputs

__all__ = [
    "MediateConfig",
    "MediateResult",
    "MediationRun",
    "choose_neuron_layer",
    "mediate",
    "mediation_items",
    "read_mediation_run",
    "resume_key",
]

logger = logging.getLogger(__name__)


@dataclass
class MediateResult:
    """What mediate measured, per task, and where it wrote it."""

    results: dict[str, MediationResult]
    neurons: dict[str, torch.Tensor]
    """task -> IE [pair, neuron] at `neuron_layer` (empty when neuron_k is 0)."""
    neuron_layer: int | None
    overlaps: dict[tuple[str, str], float]
    """(task_a, task_b) -> |A ∩ B| / k of their top-k neurons, every ordered pair."""
    counts: dict[str, dict[str, int]]
    """task -> pairs used, considered, rejected_length_mismatch, rejected_same_result_token."""
    items: dict[str, list[TokenizedMediationPair]]
    """task -> the pairs used."""
    out_dir: Path
    metadata: dict[str, Any]


# -- pairs --------------------------------------------------------------------------------------------------
def mediation_items(
    tokenizer: Any, cfg: MediateConfig, task: str
) -> tuple[list[TokenizedMediationPair], dict[str, int]]:
    """Up to `cfg.n_pairs` tokenized pairs of `task`, balanced over templates, and how many were rejected."""
    pairs = _balanced(generate_mediation_pairs(cfg.data(task)))
    top = max([9, *(int(v) for p in pairs for v in (p.base_result, p.alt_result) if v.isdigit())])
    items: list[TokenizedMediationPair] = []
    counts = {"considered": 0, "rejected_length_mismatch": 0, "rejected_same_result_token": 0}
    while len(items) < cfg.n_pairs and counts["considered"] < len(pairs):
        chunk = pairs[counts["considered"] : counts["considered"] + cfg.n_pairs - len(items)]
        kept, report = tokenize_mediation_pairs(tokenizer, chunk, max_number=top)
        items += kept
        counts["considered"] += len(chunk)
        counts["rejected_length_mismatch"] += report.rejected_length_mismatch
        counts["rejected_same_result_token"] += report.rejected_same_result_token
    if not items:
        raise DataError(f"every {task} pair was rejected by the tokenizer ({counts}); try other formats or more pairs")
    if len(items) < cfg.n_pairs:
        logger.warning("%s: only %d of %d pairs survived tokenization", task, len(items), cfg.n_pairs)
    return items, {"pairs": len(items), **counts}


def _balanced(pairs: list[MediationPair]) -> list[MediationPair]:
    """Pairs in turns over templates, formats interleaved: the first n cover as many templates as possible."""
    by_template: dict[str, list[MediationPair]] = {}
    for pair in pairs:
        by_template.setdefault(pair.template_id, []).append(pair)
    by_format: dict[str, list[str]] = {}
    for tid, group in by_template.items():
        by_format.setdefault(group[0].format, []).append(tid)
    order = [tid for turn in zip_longest(*by_format.values()) for tid in turn if tid is not None]
    return [p for turn in zip_longest(*(by_template[t] for t in order)) for p in turn if p is not None]


# -- the stage ----------------------------------------------------------------------------------------------
@torch.no_grad()
def mediate(handle: ModelHandle, cfg: MediateConfig, out_dir: str | Path, quiet: bool = False) -> MediateResult:
    """Run causal mediation on every task of `cfg`, compare their neurons, and write the run folder."""
    from tqdm.auto import tqdm

    out, start = Path(out_dir), time.perf_counter()
    view, n_layers = handle.view, handle.dims.n_layers
    layers = tuple(range(n_layers)) if cfg.layers is None else cfg.layers
    bad = [x for x in (*layers, cfg.neuron_layer) if x is not None and x >= n_layers]
    if bad:
        raise ConfigError(f"layers and neuron_layer must be below the model's {n_layers} layers; got {bad}")
    if cfg.neuron_k:
        d_mlp = view.down_proj(cfg.neuron_layer or 0).weight.shape[0 if handle.spec.conv1d else 1]
        if cfg.neuron_k > d_mlp:
            raise ConfigError(f"neuron_k must be at most the MLP width {d_mlp}; got {cfg.neuron_k}")
    items: dict[str, list[TokenizedMediationPair]] = {}
    counts: dict[str, dict[str, int]] = {}
    for task in cfg.tasks:
        items[task], counts[task] = mediation_items(handle.tokenizer, cfg, task)
        check_fits_context(handle.model, max(len(item.base_ids) for item in items[task]), "fewer or shorter formats")
    timings: dict[str, float] = {"pairs_s": time.perf_counter() - start}
    identity = json.dumps(handle.source, sort_keys=True, default=str)
    shards = {task: distributed.shard_bounds(len(task_items)) for task, task_items in items.items()}
    n_mine = sum(hi - lo for lo, hi in shards.values())
    if distributed.world_size() > 1:
        distributed.check_same("mediation pairs", [item.pair.to_dict() for v in items.values() for item in v])
    results: dict[str, MediationResult] = {}
    neurons: dict[str, torch.Tensor] = {}
    show = not quiet and distributed.is_main()
    with tqdm(total=n_mine * (2 if cfg.neuron_k else 1), desc="mediation", unit="pair", disable=not show) as bar:
        saved = _Partial(out / ".partial", bar, timings)
        for task in cfg.tasks:
            bar.set_description(f"mediation: {task}")
            key = resume_key(identity, cfg, task, items[task])
            run = partial(_mediation_dict, handle, layers, cfg, bar.update)
            parts = _sharded(saved, f"{task}-mediation", key, items[task], shards[task], run)
            results[task] = _merge_mediation(parts)
        layer = cfg.neuron_layer
        if cfg.neuron_k and layer is None:
            first = next((t for t in cfg.tasks if t in OPERATIONS), cfg.tasks[0])
            layer = choose_neuron_layer(results[first])
            logger.info("neuron layer %d: largest last-token MLP median IE on %s", layer, first)
        for task in cfg.tasks if cfg.neuron_k else ():
            assert layer is not None
            bar.set_description(f"neurons: {task}")
            key = resume_key(identity, cfg, task, items[task])
            run = partial(_neuron_dict, handle, layer, cfg, bar.update)
            parts = _sharded(saved, f"{task}-neurons{layer}", key, items[task], shards[task], run)
            neurons[task] = torch.cat([part["ie"] for part in parts])  # [pair, neuron]
    overlaps = {
        (a, b): neuron_overlap(neurons[a], neurons[b], cfg.neuron_k) for a in neurons for b in neurons
    }  # every ordered pair: the table is symmetric with 1.0 on the diagonal
    timings["total_s"] = time.perf_counter() - start
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(handle.dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "counts": counts,
        "neuron_layer": layer,
        "neuron_layer_rule": "config" if cfg.neuron_layer is not None else "largest last-token MLP median IE",
        "resumed": saved.resumed,
        "timings": timings,
        "processes": distributed.world_size(),
        "versions": package_versions(),
        "identify_runs": [],  # it reads no identify run, so no rerun of one makes it stale
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    result = MediateResult(results, neurons, layer if cfg.neuron_k else None, overlaps, counts, items, out, metadata)
    if distributed.is_main():
        write_mediate_outputs(result, cfg)
    distributed.barrier()  # the other processes return only once the folder is complete
    return result


def choose_neuron_layer(result: MediationResult) -> int:
    """The layer whose MLP at the last position has the largest median IE over pairs."""
    table = result.by_class("median")[result.components.index("mlp"), :, POSITION_CLASSES.index("last")]  # [layer]
    return result.layers[int(table.nan_to_num(float("-inf")).argmax())]


def resume_key(identity: str, cfg: MediateConfig, task: str, items: list[TokenizedMediationPair]) -> str:
    """A short hash naming one task's saved effects: same model, settings, token ids and code
    (`runs.code_version`), same key."""
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("tasks", "neuron_layer", "neuron_k", "max_rows")}
    digest = hashlib.sha256(json.dumps([identity, task, settings, code_version()], sort_keys=True,
                                       default=str).encode())  # fmt: skip
    for item in items:
        digest.update(item.base_ids.numpy().tobytes() + item.alt_ids.numpy().tobytes())
    return digest.hexdigest()[:16]


def _mediation_dict(
    handle: ModelHandle, layers: tuple[int, ...], cfg: MediateConfig, progress: Any, items: list[TokenizedMediationPair]
) -> dict[str, Any]:
    result = mediation_effects(handle.view, items, layers, cfg.components, cfg.max_rows, progress)
    return {f.name: getattr(result, f.name) for f in fields(result)}


def _neuron_dict(
    handle: ModelHandle, layer: int, cfg: MediateConfig, progress: Any, items: list[TokenizedMediationPair]
) -> dict[str, Any]:
    return {"ie": neuron_effects(handle.view, items, layer, max_rows=cfg.max_rows, progress=progress)}  # [pair, neuron]


def _sharded(
    saved: _Partial,
    name: str,
    key: str,
    items: list[TokenizedMediationPair],
    shard: tuple[int, int],
    run: Callable[[list[TokenizedMediationPair]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """`run` on this process's pairs lo..hi (saved for resume), then every process's result in pair order."""
    lo, hi = shard
    if distributed.world_size() == 1:
        return [saved.load_or_run(name, key, len(items), partial(run, items))]
    mine = [saved.load_or_run(f"{name}-pairs{lo}-{hi}", key, hi - lo, partial(run, items[lo:hi]))] if hi > lo else []
    return distributed.gather(mine)


def _merge_mediation(parts: list[dict[str, Any]]) -> MediationResult:
    """One MediationResult from consecutive slices of pairs; per-position tensors padded to the longest pair."""
    if len(parts) == 1:
        return _from_dict(parts[0])
    width = max(part["ie"].shape[-1] for part in parts)

    def padded(name: str, fill: float) -> torch.Tensor:
        tensors = [part[name] for part in parts]  # [pair, ..., pos]
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[-1]), value=fill) for t in tensors])

    merged = {name: torch.cat([part[name] for part in parts]) for name in ("total_effect", "probs", "number_correct")}
    return _from_dict(
        {**parts[0], **merged, "ie": padded("ie", float("nan")), "position_class": padded("position_class", -1)}
    )


def _from_dict(saved: dict[str, Any]) -> MediationResult:
    return MediationResult(**{**saved, "layers": tuple(saved["layers"]), "components": tuple(saved["components"])})


class _Partial:
    """Finished results saved in out/.partial as <name>-<key>.pt, so that a rerun into the same folder reuses them."""

    def __init__(self, folder: Path, bar: Any, timings: dict[str, float]) -> None:
        self.folder, self.bar, self.timings = folder, bar, timings
        self.resumed: list[str] = []

    def load_or_run(self, name: str, key: str, n: int, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The saved result (advancing the bar by its n pairs), else `run()`, saved at once and atomically."""
        path = self.folder / f"{name}-{key}.pt"
        if path.is_file():
            try:
                saved = torch.load(path, weights_only=True)
            except Exception as err:  # a damaged file is recomputed, never fatal
                logger.warning("recomputing: cannot read %s (%s)", path, err)
            else:
                logger.info("reusing %s", path)
                self.resumed.append(name)
                self.bar.update(n)
                return saved
        start = time.perf_counter()
        value = run()
        with atomic_open(path, "wb") as handle:
            torch.save(value, handle)
        self.timings[f"{name}_s"] = time.perf_counter() - start
        return value
