"""The knockout stage: effect-rank vs random-rank mean ablation on the reference set (paper Figure 3).

Reads the ranking and reference prompts of an identify run folder (`from_run`), or takes an explicit list of
components (then the ranking is their order, and the prompts come from the run or are generated and filtered
as identify does). The ablation values are taken over that whole prompt set (`knockout/ablation.py` says
how); the sweep scores `max_prompts` of its prompts, a seeded sample stratified by operation and template
(`data/sampling.py`). metadata.json records which prompts were scored, the group sizes and the fallbacks.
Writes knockout.csv, knockout_summary.csv (its random-rank columns empty with n_random 0), knockout.png and
metadata.json (last). With answers scored token by token (answer_digits, or an identify run made with it),
accuracy is of whole answers (every token the top one, teacher forced) and the answer's probability the product
of its tokens'; knockout_by_place.csv and knockout_place_summary.csv give them per answer place (units, tens,
..., `data/places.py`), with a knockout_<place>.png each.

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
from arithmech.data.carries import carry_group
from arithmech.data.places import place_name
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import build_reference_set
from arithmech.data.sampling import sample_record, stratified_sample
from arithmech.knockout.ablation import ablation_sources, alignment_groups
from arithmech.knockout.sweep import AnswerRows, SweepRow, k_values, knockout_sweep, sample_std
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, all_components, parse_component
from arithmech.patching.path import PatchingBatch
from arithmech.runs import atomic_write_json, atomic_write_text, cell, csv_text, defined_row, git_sha, package_versions
from arithmech.stages.identify_run import read_identify_run
from arithmech.stages.knockout_config import DEFAULT_MAX_K, KnockoutConfig


@dataclass
class KnockoutResult:
    rows: list[SweepRow]
    ranked: list[Component]
    out_dir: Path
    metadata: dict[str, Any]


def _ranking_and_prompts(
    handle: ModelHandle, cfg: KnockoutConfig
) -> tuple[list[Component], list[PromptPair], dict[str, Any] | None, bool]:
    """The ranking, the whole prompt set (the identify run's reference set, or one built as identify does),
    the record of the identify run read, if any, and whether answers are scored token by token."""
    run = read_identify_run(cfg.from_run, handle) if cfg.from_run else None
    if cfg.components:
        ranked = [parse_component(name, handle.dims) for name in cfg.components]
    else:
        assert run is not None
        ranked = run.ranked(None if cfg.include_mlps else "head")
    if run is not None:
        return ranked, run.pairs, run.record, cfg.answer_digits or run.answer_digits
    reference = build_reference_set(
        handle, ReferenceSetConfig(max_prompts=cfg.max_prompts, seed=cfg.seed, answer_digits=cfg.answer_digits)
    )
    return ranked, reference.tokenized.unique_pairs(), None, cfg.answer_digits


@torch.no_grad()
def knockout(handle: ModelHandle, cfg: KnockoutConfig, out_dir: str | Path, quiet: bool = False) -> KnockoutResult:
    """Run the effect-rank vs random-rank sweep and write its run folder."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    start = time.perf_counter()
    ranked, pairs, identify_run, digits = _ranking_and_prompts(handle, cfg)
    mlps = cfg.include_mlps or any(c.head is None for c in ranked)  # the control draws the kinds ranked holds
    pool = [c for c in all_components(handle.dims) if mlps or c.head is not None]
    max_k = _max_k(cfg, ranked)
    t, _ = tokenize_pairs(handle.tokenizer, pairs, answer_digits=digits)
    whole = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    keys = [f"{p.template_id or 'custom'}#{q}" for p, q in zip(t.pairs, t.answer_place.tolist(), strict=True)]
    groups = alignment_groups(keys, t.end + 1)  # answer places apart: their prompts end in other tokens
    sources = ablation_sources(handle.view, whole, cfg.ablation, groups, cfg.end_only, cfg.seed,
                               cfg.min_group_size, cfg.batch_size)  # values over the whole set  # fmt: skip
    unique = t.unique_pairs()
    chosen = stratified_sample(unique, cfg.max_prompts, cfg.seed)  # pairs, each with all its answer tokens
    rows = t.pair_rows(chosen)
    batch, sources = whole.select(torch.tensor(rows)), sources.take(rows)
    chosen_t = t.take(rows)
    groups = tuple(carry_group(p) for p in chosen_t.pairs)
    answer_rows = AnswerRows(chosen_t.pair_index, chosen_t.answer_place, groups) if digits else None
    n_configs = 1 + len(k_values(max_k)) * (1 + cfg.n_random)
    pair_lo, pair_hi = distributed.shard_bounds(len(chosen))  # a pair's answer tokens stay in one process
    lo, hi = int((chosen_t.pair_index < pair_lo).sum()), int((chosen_t.pair_index < pair_hi).sum())
    show = not quiet and distributed.is_main()
    with tqdm(total=n_configs * (hi - lo), desc="knockout", unit="row", disable=not show) as bar:

        def sweep(lo: int, hi: int) -> list[SweepRow]:
            mine = None if answer_rows is None else answer_rows.rows(lo, hi)
            return knockout_sweep(
                handle.view, batch.select(slice(lo, hi)), sources.take(slice(lo, hi)), ranked, pool, max_k,
                cfg.n_random, cfg.seed, cfg.batch_size, bar.update, mine,
            )  # fmt: skip

        if distributed.world_size() == 1:
            sweep_rows = sweep(0, len(batch))
        else:
            distributed.check_same("knockout inputs", batch.ref_ids, batch.answer_ids, [c.name for c in ranked])
            sweep_rows = _sharded_sweep(pair_hi - pair_lo, lo, hi, sweep)
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(handle.dims),
        "config": asdict(cfg),
        "identify_runs": [] if identify_run is None else [identify_run],
        "seed": cfg.seed,
        "max_k": max_k,
        "counts": {"prompts": len(chosen), "configurations": n_configs,
                   **({"scored_tokens": len(batch)} if digits else {})},  # fmt: skip
        "answer_digits": digits,
        "prompts": sample_record(unique, chosen),
        "ablation": sources.info,
        "timings": {"knockout_s": time.perf_counter() - start},
        "processes": distributed.world_size(),
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if distributed.is_main():
        write_knockout_outputs(out, sweep_rows, metadata, handle.source.get("model", "?"), cfg)
    distributed.barrier()  # the other processes return only once the folder is complete
    return KnockoutResult(sweep_rows, ranked, out, metadata)


def _max_k(cfg: KnockoutConfig, ranked: list[Component]) -> int:
    """The largest k: cfg.max_k when set, else all the --components given, or DEFAULT_MAX_K of a run's ranking."""
    if cfg.max_k is not None:
        return cfg.max_k
    return len(ranked) if cfg.components else DEFAULT_MAX_K


def _sharded_sweep(count: int, lo: int, hi: int, sweep: Callable[[int, int], list[SweepRow]]) -> list[SweepRow]:
    """The sweep over prompts lo..hi (`count` pairs), merged over processes into the rows of the whole set.

    Per configuration (and answer place) each process contributes its prompt count n_r, answered count
    (accuracy_r * n_r, an integer) and answer-probability sum (mean_prob_r * n_r); accuracy is their count over
    n, rounded to float32 as one process does, and mean_prob their sum over n (within float32 rounding of one
    process).
    """
    mine = [] if hi == lo else [(count, sweep(lo, hi))]
    parts: list[tuple[int, list[SweepRow]]] = distributed.gather(mine)
    merged = []
    for i, row in enumerate(parts[0][1]):
        accuracy, prob = _merge([(count, rows[i].accuracy, rows[i].mean_prob) for count, rows in parts])
        shares: dict[tuple[int | None, str], list[tuple[int, float, float]]] = {}  # -> (prompts, accuracy, prob)
        for _, rows in parts:
            for place, group, *share in rows[i].by_place:
                shares.setdefault((place, group), []).append(tuple(share))  # type: ignore[arg-type]
        order = sorted(shares, key=_cell_order)  # as `AnswerRows.cells` lists them
        places = [(*key, sum(n for n, _, _ in shares[key]), *_merge(shares[key])) for key in order]
        merged.append(dataclasses.replace(row, accuracy=accuracy, mean_prob=prob, by_place=tuple(places)))
    return merged


def _cell_order(key: tuple[int | None, str]) -> tuple[int, bool, str]:
    """Whole answers (place None) first, then the places from the units up; group "all" first in each."""
    place, group = key
    return (-1 if place is None else place, group != "all", group)


def _merge(shares: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(accuracy, mean_prob) of the union of parts given as (prompts, accuracy, mean_prob)."""
    n = sum(count for count, _, _ in shares)
    answered = sum(round(accuracy * count) for count, accuracy, _ in shares)
    prob = sum(mean_prob * count for count, _, mean_prob in shares)
    return float(torch.tensor(answered, dtype=torch.float32) / n), prob / n  # as correct.float().mean()


def summarize(rows: list[SweepRow]) -> list[dict[str, float]]:
    """Per k: effect-rank accuracy and probability, and the random-rank mean and sample standard deviation
    (ddof 1; NaN with no random draws, and the deviation NaN with one: knockout_summary.csv holds an empty cell
    there)."""
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
                "random_accuracy_std": sample_std(acc),
                "effect_prob": effect.mean_prob,
                "random_prob_mean": statistics.fmean(prob) if prob else math.nan,
                "random_prob_std": sample_std(prob),
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
    if rows[0].by_place:
        _write_place_outputs(out, rows, metadata, model, cfg)
    atomic_write_json(out / "metadata.json", metadata)


def _write_place_outputs(
    out: Path, rows: list[SweepRow], metadata: dict[str, Any], model: str, cfg: KnockoutConfig
) -> None:
    """knockout_by_place.csv and knockout_place_summary.csv (place "answer": whole answers, then "units",
    "tens", ...), and one knockout_<place>.png per answer place (group "all")."""
    from arithmech.report.plots import knockout_curves

    by_place = [
        {"k": r.k, "ranking": r.ranking, "seed": "" if r.seed is None else r.seed, "place": _place_label(place),
         "group": group, "prompts": n, "accuracy": cell(accuracy, ".6f"), "mean_prob": cell(prob, ".6f")}
        for r in rows for place, group, n, accuracy, prob in r.by_place
    ]  # fmt: skip
    atomic_write_text(out / "knockout_by_place.csv", csv_text(by_place))
    summary_rows = []
    for place, group, n, *_ in rows[0].by_place:
        at = [_at_place(r, place, group) for r in rows]
        summary = summarize(at)
        summary_rows += [{"place": _place_label(place), "group": group, "prompts": n, **defined_row(r)}
                         for r in summary]  # fmt: skip
        if place is not None and group == "all":
            baseline = next(r for r in at if r.ranking == "none")
            title = f"{cfg.ablation} ablation, answer {place_name(place)} digit, {n} prompts: {model}"
            path = out / f"knockout_{place_name(place)}.png"
            knockout_curves(summary, baseline.accuracy, baseline.mean_prob, path, title)
    atomic_write_text(out / "knockout_place_summary.csv", csv_text(summary_rows, float_format=".6f"))


def _place_label(place: int | None) -> str:
    """The place column of the per-place tables: "answer" for whole answers, else "units", "tens", ..."""
    return "answer" if place is None else place_name(place)


def _at_place(row: SweepRow, place: int | None, group: str) -> SweepRow:
    """The row's scores at one answer place (None: whole answers) and group, as a row of its own."""
    accuracy, prob = next((a, p) for q, g, _, a, p in row.by_place if (q, g) == (place, group))
    return dataclasses.replace(row, accuracy=accuracy, mean_prob=prob, by_place=())
