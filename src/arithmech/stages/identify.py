"""The identify stage: prompts -> reference set the model answers -> path patching -> key components.

Writes into its run folder: effects.csv, key_components.json, effects_heatmap.png, prompts.jsonl,
template_accuracy.csv and metadata.json, each atomically; metadata.json is written last.

Under `accelerate launch` every process builds the same reference set, patches its own chunks of it, and
gathers everyone's per-prompt effects (bit-identical to one process); rank 0 writes the folder.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from arithmech import distributed
from arithmech.analysis.accuracy import predict_at_end
from arithmech.analysis.agreement import compare_methods
from arithmech.analysis.ranking import KeyComponents, rank_components
from arithmech.data import (
    FORMATIONS,
    GenerationConfig,
    PromptPair,
    TokenizedPairs,
    generate_pairs,
    load_templates,
    read_prompt_file,
    tokenize_pairs,
    write_prompt_file,
)
from arithmech.data.sampling import stratified_sample
from arithmech.errors import ConfigError, DataError
from arithmech.models.load import ModelHandle
from arithmech.patching.attribution import attribution_patch
from arithmech.patching.path import VARIANTS, PatchingBatch, PatchResult, Variant, path_patch, resume_key
from arithmech.runs import atomic_write_json, atomic_write_text, git_sha, package_versions

logger = logging.getLogger(__name__)

METHODS: tuple[str, ...] = ("exact", "attribution", "both")


@dataclass(frozen=True)
class IdentifyConfig:
    """Settings of the identify stage; every field is also a CLI option."""

    operations: tuple[str, ...] = field(default=("addition",), metadata={"help": "operations to generate"})
    formations: tuple[str, ...] = field(default=FORMATIONS, metadata={"help": "formations to generate"})
    n_per_template: int = field(default=16, metadata={"help": "prompt pairs generated per template"})
    few_shot: int = field(default=3, metadata={"help": "solved examples before each query"})
    operand_min: int = field(default=0, metadata={"help": "smallest operand"})
    operand_max: int = field(default=9, metadata={"help": "largest operand"})
    prompts_file: str | None = field(default=None, metadata={"help": "JSONL of your own prompt pairs"})
    templates_file: str | None = field(default=None, metadata={"help": "JSON of your own templates"})
    max_prompts: int = field(
        default=64, metadata={"help": "reference prompts used for patching (a sample stratified by template)"}
    )
    filter_correct: bool = field(default=True, metadata={"help": "keep only prompts the model answers"})
    variant: str = field(default="path", metadata={"help": "path, direct or total"})
    method: str = field(
        default="exact", metadata={"help": "exact (path patching), attribution (first-order estimate) or both"}
    )
    threshold: float = field(default=-0.05, metadata={"help": "key if effect < threshold"})
    fraction_threshold: float | None = field(
        default=None, metadata={"help": "key if effect >= this fraction of the whole-prompt effect"}
    )
    top_k: int = field(default=10, metadata={"help": "components listed as top-k"})
    batch_size: int = field(default=16, metadata={"help": "prompts per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed for generation and sampling"})

    def __post_init__(self) -> None:
        for name in ("operations", "formations"):
            value = getattr(self, name)
            if isinstance(value, list | str):
                object.__setattr__(self, name, tuple([value] if isinstance(value, str) else value))
        if self.method not in METHODS:
            raise ConfigError(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.variant not in VARIANTS:
            raise ConfigError(f"variant {self.variant!r} is not one of {', '.join(VARIANTS)}")
        for name in ("max_prompts", "batch_size", "top_k", "n_per_template"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")

    def generation(self) -> GenerationConfig:
        return GenerationConfig(
            operations=self.operations,
            formations=self.formations,
            n_per_template=self.n_per_template,
            operand_min=self.operand_min,
            operand_max=self.operand_max,
            few_shot=self.few_shot,
            seed=self.seed,
        )


@dataclass
class IdentifyResult:
    """What identify found, and where it wrote it."""

    patch: PatchResult
    key: KeyComponents
    pairs: list[PromptPair]
    template_accuracy: dict[str, dict[str, float]]
    out_dir: Path
    metadata: dict[str, Any]


def build_reference_set(
    handle: ModelHandle, cfg: IdentifyConfig
) -> tuple[TokenizedPairs, dict[str, dict[str, float]], dict[str, int]]:
    """Generate or read prompt pairs, tokenize, keep those the model answers, and sample `max_prompts` of them.

    The sample is seeded and stratified by operation and template (`data/sampling.py`), so a small reference
    set still covers every formation.
    """
    if cfg.prompts_file:
        pairs = read_prompt_file(cfg.prompts_file)
    else:
        templates = load_templates(cfg.templates_file) if cfg.templates_file else None
        pairs = generate_pairs(cfg.generation(), templates)
    tokenized, report = tokenize_pairs(handle.tokenizer, pairs)
    predictions = predict_at_end(
        handle.view,
        tokenized.ref_ids,
        tokenized.ref_mask,
        tokenized.end,
        tokenized.answer_ids,
        cfg.batch_size,
    )
    accuracy = _template_accuracy(tokenized.pairs, predictions.correct, report.per_template)
    keep = predictions.correct if cfg.filter_correct else torch.ones_like(predictions.correct)
    n_correct = int(predictions.correct.sum())
    if not bool(keep.any()):
        raise DataError(
            f"the model answered none of the {len(tokenized.pairs)} prompts correctly, "
            "so there is no reference set; "
            "add solved examples before each query (--few-shot 3) or use easier operands"
        )
    kept = keep.nonzero().flatten().tolist()
    indices = [kept[i] for i in stratified_sample([tokenized.pairs[i] for i in kept], cfg.max_prompts, cfg.seed)]
    counts = {
        "pairs": len(pairs),
        "rejected_length_mismatch": report.rejected_length_mismatch,
        "answered_correctly": n_correct,
        "used": len(indices),
    }
    return _subset(tokenized, indices), accuracy, counts


def _subset(t: TokenizedPairs, indices: list[int]) -> TokenizedPairs:
    idx = torch.tensor(indices, dtype=torch.long)
    width = int(t.end[idx].max()) + 1
    return TokenizedPairs(
        ref_ids=t.ref_ids[idx, :width],
        cf_ids=t.cf_ids[idx, :width],
        ref_mask=t.ref_mask[idx, :width],
        cf_mask=t.cf_mask[idx, :width],
        end=t.end[idx],
        answer_ids=t.answer_ids[idx],
        roles=t.roles[idx, :width],
        pairs=[t.pairs[i] for i in indices],
        pad_id=t.pad_id,
        roles_available=t.roles_available,
    )


def _template_accuracy(
    pairs: list[PromptPair], correct: torch.Tensor, tokenized: dict[str, dict[str, int]]
) -> dict[str, dict[str, float]]:
    """Per template: pairs generated, rejected for a counterfactual of another length, kept, answered."""
    answered: dict[str, list[bool]] = {}
    for pair, ok in zip(pairs, correct.tolist(), strict=True):
        answered.setdefault(pair.template_id or "custom", []).append(bool(ok))
    table = {}
    for template, count in sorted(tokenized.items()):
        right = sum(answered.get(template, []))
        table[template] = {
            "pairs": count["kept"] + count["rejected"],
            "rejected_length_mismatch": count["rejected"],
            "kept": count["kept"],
            "correct": right,
            "accuracy": right / count["kept"] if count["kept"] else float("nan"),
        }
    return table


def identify(handle: ModelHandle, cfg: IdentifyConfig, out_dir: str | Path, quiet: bool = False) -> IdentifyResult:
    """Run the identify stage and write its run folder."""
    out = Path(out_dir)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    tokenized, accuracy, counts = build_reference_set(handle, cfg)
    timings["reference_set_s"] = time.perf_counter() - start
    logger.info("reference set: %d prompts (of %d answered correctly)", counts["used"], counts["answered_correctly"])

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
    agreement = compare_methods(exact, attribution) if exact and attribution else None
    key = rank_components(
        patch.components,
        patch.effects.tolist(),
        patch.total_effect,
        cfg.threshold,
        cfg.top_k,
        cfg.fraction_threshold,
    )
    metadata = {
        "stage": "identify",
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
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if distributed.is_main():
        write_identify_outputs(
            out, handle, patch, key, tokenized.pairs, accuracy, metadata, attribution if exact else None
        )
    distributed.barrier()  # the other processes return only once the folder is complete
    return IdentifyResult(patch, key, tokenized.pairs, accuracy, out, metadata)


def _patch_with_progress(
    handle: ModelHandle, batch: PatchingBatch, cfg: IdentifyConfig, out: Path, quiet: bool
) -> PatchResult:
    """Path patching with a progress bar; finished chunks are kept in out/.partial so a rerun resumes.

    Under a multi-process launch each process patches its own chunks (`distributed.shard_bounds`, cut at chunk
    boundaries, so the numbers are those of one process) into its own resume folder, and gets everyone's.
    """
    from tqdm.auto import tqdm

    identity = json.dumps(handle.source, sort_keys=True, default=str)
    partial = out / ".partial" / resume_key(batch, cfg.variant, cfg.batch_size, identity)
    lo, hi = distributed.shard_bounds(len(batch), unit=cfg.batch_size)
    if (lo, hi) != (0, len(batch)):
        partial = partial / f"prompts-{lo}-{hi}"  # one folder per shard: processes never share a chunk file
    if partial.exists():
        logger.info("resuming from %d saved chunks in %s", len(list(partial.glob("chunk-*.pt"))), partial)
    variant = cast(Variant, cfg.variant)  # checked in IdentifyConfig.__post_init__
    show = not quiet and distributed.is_main()
    with tqdm(total=hi - lo, desc=f"{cfg.variant} patching", unit="prompt", disable=not show) as bar:

        def scan(mine: PatchingBatch) -> PatchResult:
            return path_patch(handle.view, mine, variant, cfg.batch_size, bar.update, resume_dir=partial)

        return _sharded(batch, lo, hi, scan)


def _attribute_with_progress(
    handle: ModelHandle, batch: PatchingBatch, cfg: IdentifyConfig, quiet: bool
) -> PatchResult:
    from tqdm.auto import tqdm

    lo, hi = distributed.shard_bounds(len(batch), unit=cfg.batch_size)
    variant = cast(Variant, cfg.variant)  # checked in IdentifyConfig.__post_init__
    show = not quiet and distributed.is_main()
    with tqdm(total=hi - lo, desc=f"attribution ({cfg.variant})", unit="prompt", disable=not show) as bar:

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


def effects_csv(patch: PatchResult, key: KeyComponents) -> str:
    """One row per component: component, layer, head, kind, effect, effect_std, fraction_of_total."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["component", "layer", "head", "kind", "effect", "effect_std", "fraction_of_total"])
    std = patch.per_prompt.std(dim=1) if patch.per_prompt.shape[1] > 1 else torch.zeros(len(patch.components))
    total = key.total_effect
    for component, effect, spread in zip(patch.components, patch.effects.tolist(), std.tolist(), strict=True):
        head = "" if component.head is None else component.head
        fraction = effect / total if total else float("nan")
        writer.writerow(
            [
                component.name,
                component.layer,
                head,
                component.kind,
                f"{effect:.8g}",
                f"{spread:.8g}",
                f"{fraction:.8g}",
            ]
        )
    return buffer.getvalue()


def write_identify_outputs(
    out: Path,
    handle: ModelHandle,
    patch: PatchResult,
    key: KeyComponents,
    pairs: list[PromptPair],
    accuracy: dict[str, dict[str, float]],
    metadata: dict[str, Any],
    attribution: PatchResult | None = None,
) -> None:
    """Write every artefact atomically; metadata.json last, so its presence means the folder is complete.

    With `attribution` (method "both"), its estimates go to attribution_effects.csv and the agreement of the
    two rankings (Spearman, top-k overlap) to agreement.json.
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
    columns = ["pairs", "rejected_length_mismatch", "kept", "correct"]
    rows = ["template_id," + ",".join(columns) + ",accuracy"] + [
        f"{k}," + ",".join(str(v[c]) for c in columns) + f",{v['accuracy']:.4f}" for k, v in accuracy.items()
    ]
    atomic_write_text(out / "template_accuracy.csv", "\n".join(rows) + "\n")
    dims = handle.dims
    effects = patch.effects.numpy().reshape(dims.n_layers, dims.n_heads + 1)
    title = f"{patch.variant} patching: {handle.source.get('model', '?')}, {len(pairs)} prompts"
    effect_heatmap(effects[:, :-1], effects[:, -1], out / "effects_heatmap.png", title)
    atomic_write_json(out / "metadata.json", metadata)
    shutil.rmtree(out / ".partial", ignore_errors=True)
