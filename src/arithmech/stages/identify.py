"""The identify stage: prompts -> reference set the model answers -> path patching -> key components.

Writes into its run folder: effects.csv, key_components.json, effects_heatmap.png, prompts.jsonl,
template_accuracy.csv and metadata.json, each atomically; with answer_digits (answers of several tokens,
scored token by token) effects.csv is the mean over every scored token, and effects_by_place.csv,
place_overlap.csv and effects_heatmap_<place>.png give them per answer place, units, tens, ...
(`analysis/answer_places.py`). metadata.json is written last, with the run's
fingerprint (`lineage.py`). Analyses of an earlier identify run found in the folder are moved aside. A scan
whose effect is undefined on some prompt (an answer logit of 0 or not finite) is refused, naming the prompts; a
share of a whole-prompt effect of 0 is written as null / an empty cell, as is a Spearman correlation of a
constant ranking (agreement, method "both") and the accuracy of a template none of whose pairs was kept.

Under `accelerate launch` every process builds the same reference set, patches its own chunks of it, and
gathers everyone's per-prompt effects (bit-identical to one process); rank 0 writes the folder.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch

from arithmech import distributed
from arithmech.analysis.agreement import compare_methods
from arithmech.analysis.answer_places import PLACE_COLUMNS, place_effect_table, place_effects, place_overlap
from arithmech.analysis.ranking import KeyComponents, rank_components
from arithmech.data import PromptPair, write_prompt_file
from arithmech.data.pair_checks import describe, pair_location
from arithmech.data.places import place_name
from arithmech.data.reference_set import ReferenceSet, build_reference_set
from arithmech.data.tokens import TokenizedPairs
from arithmech.errors import DataError
from arithmech.lineage import identify_fingerprint, move_aside_stale
from arithmech.models.load import ModelHandle
from arithmech.patching.attribution import attribution_patch
from arithmech.patching.path import PatchingBatch, PatchResult, length_chunks, path_patch, resume_key
from arithmech.patching.variants import Variant
from arithmech.runs import atomic_write_json, atomic_write_text, cell, csv_text, defined_row, git_sha, package_versions
from arithmech.stages.identify_config import IdentifyConfig

logger = logging.getLogger(__name__)


@dataclass
class IdentifyResult:
    """What identify found, and where it wrote it."""

    patch: PatchResult
    """Per scored row: one per prompt, or (answer_digits) one per answer token of each prompt."""
    key: KeyComponents
    pairs: list[PromptPair]
    """The reference prompts, one per pair."""
    template_accuracy: dict[str, dict[str, float | None]]
    out_dir: Path
    metadata: dict[str, Any]


@torch.no_grad()
def identify(handle: ModelHandle, cfg: IdentifyConfig, out_dir: str | Path, quiet: bool = False) -> IdentifyResult:
    """Run the identify stage and write its run folder."""
    out = Path(out_dir)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    reference = _reference_with_progress(handle, cfg, out, quiet)
    tokenized, accuracy, counts = reference.tokenized, reference.template_accuracy, reference.counts
    timings["reference_set_s"] = time.perf_counter() - start
    logger.info("reference set: %s", reference_counts(counts, cfg.filter_correct))

    batch = PatchingBatch(
        tokenized.ref_ids, tokenized.ref_mask, tokenized.cf_ids, tokenized.cf_mask, tokenized.end, tokenized.answer_ids
    )
    exact = attribution = None
    if cfg.method in ("exact", "both"):
        start = time.perf_counter()
        exact = _patch_with_progress(handle, batch, cfg, out, quiet)
        timings["path_patching_s"] = time.perf_counter() - start
    if cfg.method in ("attribution", "both"):
        start = time.perf_counter()
        attribution = _attribute_with_progress(handle, batch, cfg, quiet)
        timings["attribution_s"] = time.perf_counter() - start
    patch = exact or attribution
    assert patch is not None
    try:
        for result in (r for r in (exact, attribution) if r is not None):
            check_finite(result, tokenized.pairs, tokenized.pair_index)
    except DataError:
        shutil.rmtree(out / ".partial", ignore_errors=True)  # its chunks would be refused again
        raise
    agreement = defined_row(compare_methods(exact, attribution)) if exact and attribution else None
    key = rank_components(
        patch.components,
        patch.effects.tolist(),
        patch.total_effect,
        cfg.threshold,
        cfg.top_k,
        cfg.fraction_threshold,
    )
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(handle.dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "counts": counts,
        "total_effect": patch.total_effect,
        "method": cfg.method,
        "agreement": agreement,
        "timings": timings,
        "processes": distributed.world_size(),
        "versions": package_versions(),
        "identify_runs": [],  # identify reads none: it is the run the others read
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if cfg.answer_digits:
        metadata["answer_places"] = _place_counts(tokenized)
        metadata["carry_accuracy"] = reference.carry_accuracy  # before sampling: how the model does per group
    if distributed.is_main():
        write_identify_outputs(
            out, handle, patch, key, tokenized.unique_pairs(), accuracy, metadata, attribution if exact else None,
            tokenized if cfg.answer_digits else None,
        )  # fmt: skip
    distributed.barrier()  # the other processes return only once the folder is complete
    return IdentifyResult(patch, key, tokenized.unique_pairs(), accuracy, out, metadata)


def _reference_with_progress(handle: ModelHandle, cfg: IdentifyConfig, out: Path, quiet: bool) -> ReferenceSet:
    """The reference set, with a progress bar of the answer check, whose result is kept in out/.partial so a
    rerun into the folder reads it instead of running the model again."""
    from tqdm.auto import tqdm

    show = not quiet and distributed.is_main()
    with tqdm(desc="checking answers", unit="prompt", disable=not show) as bar:
        return build_reference_set(handle, cfg, cache_dir=out / ".partial", progress=bar)


def _patch_with_progress(
    handle: ModelHandle, batch: PatchingBatch, cfg: IdentifyConfig, out: Path, quiet: bool
) -> PatchResult:
    """Path patching with a progress bar; finished chunks are kept in out/.partial so a rerun resumes.

    Under a multi-process launch each process patches its own chunks (the engine's `length_chunks` of the whole
    batch, whole chunks per process, so the numbers are those of one process) into its own resume folder, and
    gets everyone's.
    """
    from tqdm.auto import tqdm

    identity = json.dumps(handle.source, sort_keys=True, default=str)
    partial = out / ".partial" / resume_key(batch, cfg.variant, cfg.batch_size, identity)
    chunks = length_chunks(batch, cfg.batch_size)
    order = torch.cat(chunks)  # the prompts chunk by chunk: every chunk a slice of the reordered batch
    starts = [0, *torch.tensor([len(c) for c in chunks]).cumsum(0).tolist()]
    first, last = distributed.shard_bounds(len(chunks))
    lo, hi = starts[first], starts[last]
    if (lo, hi) != (0, len(batch)):
        partial = partial / f"prompts-{lo}-{hi}"  # one folder per shard: processes never share a chunk file
    if partial.exists():
        logger.info("resuming from %d saved chunks in %s", len(list(partial.glob("chunk-*.pt"))), partial)
    variant = cast(Variant, cfg.variant)  # checked in IdentifyConfig.__post_init__
    show = not quiet and distributed.is_main()
    unit = "row" if cfg.answer_digits else "prompt"  # answer digits: a row per answer token
    with tqdm(total=hi - lo, desc=f"{cfg.variant} patching", unit=unit, disable=not show) as bar:

        def scan(mine: PatchingBatch) -> PatchResult:
            return path_patch(handle.view, mine, variant, cfg.batch_size, bar.update, resume_dir=partial)

        ordered = _sharded(batch.select(order), lo, hi, scan)
    back = order.argsort()  # each prompt's place in the reordered batch
    return PatchResult(ordered.components, ordered.per_prompt[:, back], ordered.ref_logit[back],
                       ordered.cf_logit[back], ordered.variant)  # fmt: skip


def _attribute_with_progress(
    handle: ModelHandle, batch: PatchingBatch, cfg: IdentifyConfig, quiet: bool
) -> PatchResult:
    from tqdm.auto import tqdm

    lo, hi = distributed.shard_bounds(len(batch), unit=cfg.batch_size)
    variant = cast(Variant, cfg.variant)  # checked in IdentifyConfig.__post_init__
    show = not quiet and distributed.is_main()
    unit = "row" if cfg.answer_digits else "prompt"  # answer digits: a row per answer token
    with tqdm(total=hi - lo, desc=f"attribution ({cfg.variant})", unit=unit, disable=not show) as bar:

        def scan(mine: PatchingBatch) -> PatchResult:
            return attribution_patch(handle.view, mine, variant, cfg.batch_size, bar.update)

        return _sharded(batch, lo, hi, scan)


def _sharded(batch: PatchingBatch, lo: int, hi: int, scan: Callable[[PatchingBatch], PatchResult]) -> PatchResult:
    """`scan` of prompts lo..hi and, under a multi-process launch, every process's results in prompt order."""
    if distributed.world_size() == 1:
        return scan(batch)
    distributed.check_same("reference sets", batch.ref_ids, batch.cf_ids, batch.end, batch.answer_ids)
    mine = [scan(batch.select(slice(lo, hi)))] if hi > lo else []  # a shard is empty with fewer chunks than ranks
    parts: list[PatchResult] = distributed.gather(mine)  # rank order = prompt order
    return PatchResult(
        components=parts[0].components,
        per_prompt=torch.cat([p.per_prompt for p in parts], dim=1),  # [component, batch]
        ref_logit=torch.cat([p.ref_logit for p in parts]),
        cf_logit=torch.cat([p.cf_logit for p in parts]),
        variant=parts[0].variant,
    )


def _place_counts(tokenized: TokenizedPairs) -> dict[str, int]:
    """Scored tokens per answer place ("units", "tens", ...), from the units up: higher places have only the
    longer answers."""
    return {place_name(p): n for p, n in sorted(Counter(tokenized.answer_place.tolist()).items())}


def check_finite(patch: PatchResult, pairs: list[PromptPair], pair_index: torch.Tensor | None = None) -> None:
    """Refuse a scan whose effect is undefined on some prompts: an answer logit that is 0 (the relative change
    divides by it) or not finite (float16 overflow, a broken checkpoint). pairs[row] is each scored row's pair,
    pair_index[row] its number (default: one row per pair)."""
    finite = torch.isfinite(patch.per_prompt).all(dim=0) & torch.isfinite(patch.ref_logit + patch.cf_logit)  # [batch]
    bad = (~finite | (patch.ref_logit == 0)).nonzero().flatten().tolist()
    if bad:
        number = list(range(len(pairs))) if pair_index is None else pair_index.tolist()
        first = {number[i]: i for i in reversed(bad)}  # a pair's first bad row names it once
        where = describe([pair_location(pairs[i], n + 1) for n, i in sorted(first.items())], number[-1] + 1)
        raise DataError(
            f"{where}: the {patch.variant} patching effect is undefined, since the answer's logit is 0 or not "
            "finite there ((patched - ref) / |ref| has no value); load the model in float32 (--dtype float32), "
            "or leave these prompts out"
        )


def reference_counts(counts: dict[str, int], filtered: bool) -> str:
    """'16 prompts (drawn from the 40 of 48 answered correctly)': how many prompts the reference set holds, and
    from which; with --keep-incorrect they are drawn from all the checked ones, whether answered or not."""
    checked, used = counts["pairs"] - counts["rejected_length_mismatch"], counts["used"]
    prompts = f"{used} prompt{'' if used == 1 else 's'}"
    if filtered:
        return f"{prompts} (drawn from the {counts['answered_correctly']} of {checked} answered correctly)"
    return (f"{prompts} of {checked}, answered or not (--keep-incorrect); "
            f"{counts['answered_correctly']} of the {checked} answered correctly")  # fmt: skip


def effects_csv(patch: PatchResult, key: KeyComponents) -> str:
    """One row per component: component, layer, head, kind, effect, effect_std, fraction_of_total.

    fraction_of_total is empty when the whole-prompt effect is 0 (a share of it is undefined); effect_std (the
    sample sd over prompts) is empty for a single prompt, where it is undefined.
    """
    std = patch.per_prompt.std(dim=1).tolist() if patch.per_prompt.shape[1] > 1 else [None] * len(patch.components)
    total = key.total_effect
    rows = [
        {
            "component": component.name,
            "layer": component.layer,
            "head": "" if component.head is None else component.head,
            "kind": component.kind,
            "effect": cell(effect, ".8g"),
            "effect_std": cell(spread, ".8g"),
            "fraction_of_total": cell(effect / total if total else None, ".8g"),
        }
        for component, effect, spread in zip(patch.components, patch.effects.tolist(), std, strict=True)
    ]
    return csv_text(rows, EFFECT_COLUMNS)


EFFECT_COLUMNS = ("component", "layer", "head", "kind", "effect", "effect_std", "fraction_of_total")
TEMPLATE_COLUMNS = ("template_id", "pairs", "rejected_length_mismatch", "kept", "correct", "accuracy")
"""template_accuracy.csv; accuracy is empty for a template none of whose pairs was kept (0 of 0 is undefined)."""


def write_identify_outputs(
    out: Path,
    handle: ModelHandle,
    patch: PatchResult,
    key: KeyComponents,
    pairs: list[PromptPair],
    accuracy: dict[str, dict[str, float | None]],
    metadata: dict[str, Any],
    attribution: PatchResult | None = None,
    places: TokenizedPairs | None = None,
) -> None:
    """Write every artefact atomically; metadata.json last, so its presence means the folder is complete.

    metadata.json records the run's fingerprint; analyses in `out`'s subfolders made from an earlier run (another
    fingerprint) are moved aside to out/stale-<time>/ with a warning, so none is mistaken for one of this run.
    With `attribution` (method "both"), its estimates go to attribution_effects.csv and the agreement of the
    two rankings (Spearman, top-k overlap) to agreement.json. With `places` (the scan's rows, answer digits),
    the per-place tables and heatmaps too.
    """
    from arithmech.report.plots import effect_heatmap

    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    atomic_write_text(out / "effects.csv", effects_csv(patch, key))
    atomic_write_json(out / "key_components.json", key.to_json())
    if attribution is not None:
        atomic_write_text(out / "attribution_effects.csv", effects_csv(attribution, key))
        atomic_write_json(out / "agreement.json", metadata["agreement"])
    write_prompt_file(out / "prompts.jsonl", pairs)
    metadata["fingerprint"] = identify_fingerprint(out)  # of the files analyses read (lineage.py)
    move_aside_stale(out, metadata["fingerprint"], metadata["created"])  # analyses of an earlier run in `out`
    rows = [{"template_id": k, **v, "accuracy": cell(v["accuracy"], ".4f")} for k, v in accuracy.items()]
    atomic_write_text(out / "template_accuracy.csv", csv_text(rows, TEMPLATE_COLUMNS))
    dims = handle.dims
    effects = patch.effects.numpy().reshape(dims.n_layers, dims.n_heads + 1)
    title = f"{patch.variant} patching: {handle.source.get('model', '?')}, {len(pairs)} prompts"
    effect_heatmap(effects[:, :-1], effects[:, -1], out / "effects_heatmap.png", title)
    if places is not None:
        _write_place_outputs(out, handle, patch, places)
    atomic_write_json(out / "metadata.json", metadata)
    shutil.rmtree(out / ".partial", ignore_errors=True)


def _write_place_outputs(out: Path, handle: ModelHandle, patch: PatchResult, places: TokenizedPairs) -> None:
    """effects_by_place.csv, place_overlap.csv (with two places or more) and one heatmap per place."""
    from arithmech.report.plots import effect_heatmap

    atomic_write_text(out / "effects_by_place.csv", csv_text(place_effects(patch, places), PLACE_COLUMNS))
    overlap = place_overlap(patch, places)
    if overlap:
        atomic_write_text(out / "place_overlap.csv", csv_text(overlap))
    dims = handle.dims
    for (place, group), effect in place_effect_table(patch, places).items():
        if group != "all":
            continue
        grid = effect.numpy().reshape(dims.n_layers, dims.n_heads + 1)
        n = int((places.answer_place == place).sum())
        name = place_name(place)
        title = f"{patch.variant} patching, answer {name} digit: {handle.source.get('model', '?')}, {n} prompts"
        effect_heatmap(grid[:, :-1], grid[:, -1], out / f"effects_heatmap_{name}.png", title)
