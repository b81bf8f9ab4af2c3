"""The knockout stage: effect-rank vs random-rank mean ablation, held out and in sample (paper Figure 3).

Reads the ranking and reference prompts of an identify run folder (`from_run`), or takes an explicit list of
components (then the ranking is their order).

Prompt sets: find on one part of the data, evaluate on another
    held_out   prompts the ranking never saw: the identify run's templates and generation settings, with final
               queries that state no fact of a ranked prompt (a problem, its swap or its inverse: 3 + 5 and
               5 + 3 are one fact) and no ranked prompt's text, filtered to correct answers as identify does, as
               many as the run's reference set holds, a seeded sample stratified by operation and template
               (`data/heldout.py` gives the rule and why the run's leftover prompts are not enough).
    in_sample  the identify run's reference set: the prompts path patching ranked the components on. Knocking
               the ranked components out there measures them where they were chosen, so it overstates what
               they do; it is written second, for comparison.
    unranked   components given by name (--components) without an identify run: they were not ranked on any
               prompts here, so no prompt is in sample or held out; the prompts are generated and filtered as
               identify does, and metadata.json says so ("split").
    With --from and --components, the components are taken to have been ranked on the run's prompts (they are
    usually its key components), so both sets are scored. No held-out prompt left (every fact of the operand
    range ranked, or none answered) leaves the in-sample set alone, with a warning and the reason in
    metadata.json; so does held_out off (--no-held-out).

Per prompt set, the ablation values are taken over that whole set (`knockout/ablation.py`: means of its own
counterfactual prompts, grouped by template and token length), so the held-out curve uses no activation of a
ranked prompt; the sweep scores `max_prompts` of its prompts, a seeded sample stratified by operation and
template (`data/sampling.py`). The same configurations (effect-ranked top k, and random draws seeded by
(seed, k, draw)) are scored on every set.

Writes knockout.csv and knockout_summary.csv (a prompt_set column first, held_out rows first; the random-rank
columns empty with n_random 0), knockout.png (both curves) and metadata.json (last: which prompts each set
holds, its counts, its ablation groups and fallbacks). With answers scored token by token (answer_digits, or an
identify run made with it), accuracy is of whole answers (every token the top one, teacher forced) and the
answer's probability the product of its tokens'; knockout_by_place.csv and knockout_place_summary.csv give them
per answer place (units, tens, ..., `data/places.py`), with a knockout_<place>.png each (`knockout_outputs.py`).

Under `accelerate launch` every process builds both prompt sets and computes their ablation sources on the
whole set (a mean over a template group must see all of its prompts), sweeps its own slice of each set's
prompts, and the per-configuration counts are summed over processes (`_sharded_sweep`); rank 0 writes the folder.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech import distributed
from arithmech.data import PromptPair, tokenize_pairs
from arithmech.data.carries import carry_group
from arithmech.data.heldout import HeldOut, heldout_prompts, reference_config
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import build_reference_set
from arithmech.data.sampling import sample_record, stratified_sample
from arithmech.data.tokens import TokenizedPairs
from arithmech.knockout.ablation import AblationSources, ablation_sources, alignment_groups
from arithmech.knockout.configurations import k_values
from arithmech.knockout.sweep import AnswerRows, SweepRow, knockout_sweep
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, all_components, parse_component
from arithmech.patching.path import PatchingBatch
from arithmech.runs import git_sha, package_versions
from arithmech.stages.identify_run import IdentifyRun, read_identify_run
from arithmech.stages.knockout_config import KnockoutConfig
from arithmech.stages.knockout_outputs import prompt_file, write_knockout_outputs

logger = logging.getLogger(__name__)

HELD_OUT, IN_SAMPLE, UNRANKED = "held_out", "in_sample", "unranked"
"""The prompt sets (`SweepRow.prompt_set`, the prompt_set column), in the order they are written."""
IN_SAMPLE_RULE = "the identify run's reference set: the prompts path patching ranked the components on"
UNRANKED_RULE = (
    "components given by name without an identify run: not ranked on prompts here, so no prompt is in sample or "
    "held out; prompts generated and filtered as identify does"
)


@dataclass
class KnockoutResult:
    rows: list[SweepRow]
    """Every prompt set's rows (`SweepRow.prompt_set`), held_out first."""
    ranked: list[Component]
    out_dir: Path
    metadata: dict[str, Any]

    def curve(self, prompt_set: str) -> list[SweepRow]:
        """The rows of one prompt set: "held_out", "in_sample" or "unranked"."""
        return [r for r in self.rows if r.prompt_set == prompt_set]


@dataclass(frozen=True)
class PromptSet:
    """One set of prompts knocked out on, and what metadata.json records of where it came from."""

    name: str
    tokenized: TokenizedPairs
    record: dict[str, Any]


@dataclass
class _Prepared:
    """A prompt set made ready for the sweep: its scored sample, ablation values and shard."""

    name: str
    batch: PatchingBatch
    sources: AblationSources
    answer_rows: AnswerRows | None
    prompts: list[PromptPair]
    """The whole set, written to prompts_<name>.jsonl (the sample's indices point into it)."""
    n_scored: int
    lo: int
    hi: int
    """This process's rows of the sample (whole pairs), and how many pairs they hold."""
    shard_pairs: int
    record: dict[str, Any]


def prompt_sets(
    handle: ModelHandle, cfg: KnockoutConfig, quiet: bool = True
) -> tuple[list[Component], list[PromptSet], IdentifyRun | None, bool, str]:
    """The ranking, the prompt sets (held_out first), the identify run read (if any), whether answers are scored
    token by token, and a sentence saying which sets there are and why (metadata.json "split")."""
    run = read_identify_run(cfg.from_run, handle) if cfg.from_run else None
    if cfg.components:
        ranked = [parse_component(name, handle.dims) for name in cfg.components]
    else:
        assert run is not None
        ranked = run.ranked(None if cfg.include_mlps else "head")
    if run is None:
        reference = build_reference_set(
            handle, ReferenceSetConfig(max_prompts=cfg.max_prompts, seed=cfg.seed, answer_digits=cfg.answer_digits)
        )
        t, _ = tokenize_pairs(handle.tokenizer, reference.tokenized.unique_pairs(), answer_digits=cfg.answer_digits)
        return ranked, [PromptSet(UNRANKED, t, {"rule": UNRANKED_RULE})], None, cfg.answer_digits, UNRANKED_RULE
    digits = cfg.answer_digits or run.answer_digits
    t, _ = tokenize_pairs(handle.tokenizer, run.pairs, answer_digits=digits)
    in_sample = PromptSet(IN_SAMPLE, t, {"rule": IN_SAMPLE_RULE})
    if not cfg.held_out:
        why = "in sample only: held-out prompts not asked for (held_out off, --no-held-out)"
        return ranked, [in_sample], run, digits, why
    held = _held_out(handle, run, digits, quiet)
    if held.tokenized is None:
        why = held.record["why_none"]
        logger.warning("no held-out prompts, so knockout scores the ranked prompts only (in sample): %s", why)
        return ranked, [in_sample], run, digits, f"in sample only: no held-out prompts ({why})"
    split = "held out (prompts and facts the ranking never saw), then in sample (the ranked prompts)"
    return ranked, [PromptSet(HELD_OUT, held.tokenized, held.record), in_sample], run, digits, split


def _held_out(handle: ModelHandle, run: IdentifyRun, digits: bool, quiet: bool) -> HeldOut:
    """`data/heldout.py`'s held-out prompts of an identify run, as many as its reference set holds."""
    from tqdm.auto import tqdm

    with tqdm(desc="checking held-out answers", unit="prompt", disable=quiet or not distributed.is_main()) as bar:
        return heldout_prompts(handle, run.pairs, reference_config(run.metadata.get("config", {})), len(run.pairs),
                               digits, bar)  # fmt: skip


def _prepare(handle: ModelHandle, cfg: KnockoutConfig, prompts: PromptSet, digits: bool) -> _Prepared:
    """Ablation values over the whole set, then the stratified sample of max_prompts scored and this process's
    shard of it."""
    t = prompts.tokenized
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
    groups_of = tuple(carry_group(p) for p in chosen_t.pairs)
    answer_rows = AnswerRows(chosen_t.pair_index, chosen_t.answer_place, groups_of) if digits else None
    pair_lo, pair_hi = distributed.shard_bounds(len(chosen))  # a pair's answer tokens stay in one process
    lo, hi = int((chosen_t.pair_index < pair_lo).sum()), int((chosen_t.pair_index < pair_hi).sum())
    record = {**prompts.record, "file": prompt_file(prompts.name), "prompts": len(chosen), "set": len(unique),
              **({"scored_tokens": len(batch)} if digits else {}), "scored": sample_record(unique, chosen),
              "ablation": sources.info}  # fmt: skip
    return _Prepared(prompts.name, batch, sources, answer_rows, unique, len(chosen), lo, hi, pair_hi - pair_lo,
                     record)  # fmt: skip


@torch.no_grad()
def knockout(handle: ModelHandle, cfg: KnockoutConfig, out_dir: str | Path, quiet: bool = False) -> KnockoutResult:
    """Run the effect-rank vs random-rank sweep on every prompt set and write its run folder."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    start = time.perf_counter()
    ranked, sets, run, digits, split = prompt_sets(handle, cfg, quiet)
    built = time.perf_counter() - start  # the held-out set's answer check is most of it
    mlps = cfg.include_mlps or any(c.head is None for c in ranked)  # the control draws the kinds ranked holds
    pool = [c for c in all_components(handle.dims) if mlps or c.head is not None]
    max_k = cfg.largest_k
    prepared = [_prepare(handle, cfg, s, digits) for s in sets]
    n_configs = 1 + len(k_values(max_k)) * (1 + cfg.n_random)
    show = not quiet and distributed.is_main()
    rows: list[SweepRow] = []
    with tqdm(total=n_configs * sum(p.hi - p.lo for p in prepared), desc="knockout", unit="row",
              disable=not show) as bar:  # fmt: skip
        for part in prepared:

            def sweep(lo: int, hi: int, part: _Prepared = part) -> list[SweepRow]:
                mine = None if part.answer_rows is None else part.answer_rows.rows(lo, hi)
                return knockout_sweep(
                    handle.view, part.batch.select(slice(lo, hi)), part.sources.take(slice(lo, hi)), ranked, pool,
                    max_k, cfg.n_random, cfg.seed, cfg.batch_size, bar.update, mine,
                )  # fmt: skip

            if distributed.world_size() == 1:
                swept = sweep(0, len(part.batch))
            else:
                distributed.check_same(f"knockout inputs ({part.name})", part.batch.ref_ids, part.batch.answer_ids,
                                       [c.name for c in ranked])  # fmt: skip
                swept = _sharded_sweep(part.shard_pairs, part.lo, part.hi, sweep)
            rows += [dataclasses.replace(r, prompt_set=part.name) for r in swept]
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(handle.dims),
        "config": asdict(cfg),
        "identify_runs": [] if run is None else [run.record],
        "seed": cfg.seed,
        "max_k": max_k,
        "split": split,
        "counts": {"prompts": {p.name: p.n_scored for p in prepared}, "configurations": n_configs,
                   **({"scored_tokens": {p.name: len(p.batch) for p in prepared}} if digits else {})},  # fmt: skip
        "answer_digits": digits,
        "prompt_sets": {p.name: p.record for p in prepared},
        "timings": {"prompt_sets_s": built, "knockout_s": time.perf_counter() - start},
        "processes": distributed.world_size(),
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if distributed.is_main():
        write_knockout_outputs(out, rows, metadata, handle.source.get("model", "?"), cfg,
                               {prompt_file(p.name): p.prompts for p in prepared})  # fmt: skip
    distributed.barrier()  # the other processes return only once the folder is complete
    return KnockoutResult(rows, ranked, out, metadata)


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
