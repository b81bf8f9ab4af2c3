"""The knockout stage: effect-rank vs random-rank mean ablation on the reference set (paper Figure 3).

Reads the ranking and reference prompts of an identify run folder (`from_run`), or takes an explicit list of
components (then the ranking is their order, and the prompts come from the run or are generated and filtered
as identify does). The ablation values are taken over that whole prompt set (`knockout/ablation.py` says
how); the sweep scores `max_prompts` of its prompts, a seeded sample stratified by operation and template
(`data/sampling.py`). metadata.json records which prompts were scored, the group sizes and the fallbacks.
Writes knockout.csv, knockout_summary.csv (its random-rank columns empty with n_random 0), knockout.png and
metadata.json (last).

Under `accelerate launch` every process computes the ablation sources on the whole prompt set (a mean over a
template group must see all of its prompts), sweeps its own slice of the prompts, and the per-configuration
counts are summed over processes (`_sharded_sweep`); rank 0 writes the folder.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech import distributed
from arithmech.data import PromptPair, tokenize_pairs
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import build_reference_set
from arithmech.data.sampling import sample_record, stratified_sample
from arithmech.knockout.ablation import AblationSources, ablation_sources, alignment_groups
from arithmech.knockout.sweep import SweepRow, k_values, knockout_sweep
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, all_components, parse_component
from arithmech.patching.path import PatchingBatch
from arithmech.runs import atomic_write_json, atomic_write_text, cell, csv_text, defined_row, git_sha, package_versions
from arithmech.stages.identify_run import read_identify_run
from arithmech.stages.knockout_config import KnockoutConfig


@dataclass
class KnockoutResult:
    rows: list[SweepRow]
    ranked: list[Component]
    out_dir: Path
    metadata: dict[str, Any]


def _ranking_and_prompts(
    handle: ModelHandle, cfg: KnockoutConfig
) -> tuple[list[Component], list[PromptPair], dict[str, Any] | None]:
    """The ranking, the whole prompt set (the identify run's reference set, or one built as identify does) and
    the record of the identify run read, if any."""
    run = read_identify_run(cfg.from_run, handle) if cfg.from_run else None
    if cfg.components:
        ranked = [parse_component(name, handle.dims) for name in cfg.components]
    else:
        assert run is not None
        ranked = run.ranked(None if cfg.include_mlps else "head")
    if run is not None:
        return ranked, run.pairs, run.record
    reference = build_reference_set(handle, ReferenceSetConfig(max_prompts=cfg.max_prompts, seed=cfg.seed))
    return ranked, reference.tokenized.pairs, None


@torch.no_grad()
def knockout(handle: ModelHandle, cfg: KnockoutConfig, out_dir: str | Path, quiet: bool = False) -> KnockoutResult:
    """Run the effect-rank vs random-rank sweep and write its run folder."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    start = time.perf_counter()
    ranked, pairs, identify_run = _ranking_and_prompts(handle, cfg)
    pool = [c for c in all_components(handle.dims) if cfg.include_mlps or c.head is not None]
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    whole = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    groups = alignment_groups([p.template_id for p in t.pairs], t.end + 1)
    sources = ablation_sources(handle.view, whole, cfg.ablation, groups, cfg.end_only, cfg.seed,
                               cfg.min_group_size, cfg.batch_size)  # values over the whole set  # fmt: skip
    chosen = stratified_sample(t.pairs, cfg.max_prompts, cfg.seed)
    batch, sources = whole.select(torch.tensor(chosen)), sources.take(chosen)
    n_configs = 1 + len(k_values(cfg.max_k)) * (1 + cfg.n_random)
    lo, hi = distributed.shard_bounds(len(batch))
    show = not quiet and distributed.is_main()
    with tqdm(total=n_configs * (hi - lo), desc="knockout", unit="row", disable=not show) as bar:

        def sweep(mine: PatchingBatch, mine_sources: AblationSources) -> list[SweepRow]:
            return knockout_sweep(
                handle.view, mine, mine_sources, ranked, pool, cfg.max_k, cfg.n_random, cfg.seed, cfg.batch_size,
                bar.update,
            )  # fmt: skip

        if distributed.world_size() == 1:
            rows = sweep(batch, sources)
        else:
            distributed.check_same("knockout inputs", batch.ref_ids, batch.answer_ids, [c.name for c in ranked])
            rows = _sharded_sweep(batch, sources, lo, hi, sweep)
    metadata = {
        "stage": "knockout",
        "model": handle.source,
        "dims": asdict(handle.dims),
        "config": asdict(cfg),
        "identify_run": identify_run,
        "seed": cfg.seed,
        "counts": {"prompts": len(batch), "configurations": n_configs},
        "prompts": sample_record(t.pairs, chosen),
        "ablation": sources.info,
        "timings": {"knockout_s": time.perf_counter() - start},
        "processes": distributed.world_size(),
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if distributed.is_main():
        write_knockout_outputs(out, rows, metadata, handle.source.get("model", "?"), cfg)
    distributed.barrier()  # the other processes return only once the folder is complete
    return KnockoutResult(rows, ranked, out, metadata)


def _sharded_sweep(
    batch: PatchingBatch,
    sources: AblationSources,
    lo: int,
    hi: int,
    sweep: Callable[[PatchingBatch, AblationSources], list[SweepRow]],
) -> list[SweepRow]:
    """The sweep over prompts lo..hi, merged over processes into the rows of the whole set.

    Per configuration each process contributes its prompt count n_r, answered count (accuracy_r * n_r, an
    integer) and answer-probability sum (mean_prob_r * n_r); accuracy is their count over n, rounded to
    float32 as one process does, and mean_prob their sum over n (within float32 rounding of one process).
    """
    mine = [] if hi == lo else [(hi - lo, sweep(batch.select(slice(lo, hi)), sources.take(slice(lo, hi))))]
    parts: list[tuple[int, list[SweepRow]]] = distributed.gather(mine)
    n = sum(count for count, _ in parts)
    merged = []
    for i, row in enumerate(parts[0][1]):
        answered = sum(round(rows[i].accuracy * count) for count, rows in parts)
        prob = sum(rows[i].mean_prob * count for count, rows in parts)
        accuracy = float(torch.tensor(answered, dtype=torch.float32) / n)  # as correct.float().mean()
        merged.append(dataclasses.replace(row, accuracy=accuracy, mean_prob=prob / n))
    return merged


def summarize(rows: list[SweepRow]) -> list[dict[str, float]]:
    """Per k: effect-rank accuracy and probability, and the random-rank mean and standard deviation (NaN with
    no random draws; knockout_summary.csv holds an empty cell there)."""
    out = []
    for k in sorted({r.k for r in rows if r.k > 0}):
        effect = next(r for r in rows if r.k == k and r.ranking == "effect")
        rand = [r for r in rows if r.k == k and r.ranking == "random"]
        acc = [r.accuracy for r in rand]
        prob = [r.mean_prob for r in rand]
        out.append(
            {
                "k": k,
                "effect_accuracy": effect.accuracy,
                "random_accuracy_mean": statistics.fmean(acc) if acc else math.nan,
                "random_accuracy_std": statistics.pstdev(acc) if acc else math.nan,
                "effect_prob": effect.mean_prob,
                "random_prob_mean": statistics.fmean(prob) if prob else math.nan,
                "random_prob_std": statistics.pstdev(prob) if prob else math.nan,
            }
        )
    return out


def write_knockout_outputs(
    out: Path, rows: list[SweepRow], metadata: dict[str, Any], model: str, cfg: KnockoutConfig
) -> None:
    from arithmech.report.plots import knockout_curves

    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["k", "ranking", "seed", "accuracy", "mean_prob", "components"])
    for r in rows:
        writer.writerow(
            [
                r.k,
                r.ranking,
                "" if r.seed is None else r.seed,
                cell(r.accuracy, ".6f"),
                cell(r.mean_prob, ".6f"),
                " ".join(r.components),
            ]
        )
    atomic_write_text(out / "knockout.csv", buffer.getvalue())
    summary = summarize(rows)
    atomic_write_text(out / "knockout_summary.csv", csv_text([defined_row(r) for r in summary], float_format=".6f"))
    baseline = next(r for r in rows if r.ranking == "none")
    title = f"{cfg.ablation} ablation, {metadata['counts']['prompts']} prompts: {model}"
    knockout_curves(summary, baseline.accuracy, baseline.mean_prob, out / "knockout.png", title)
    atomic_write_json(out / "metadata.json", metadata)
