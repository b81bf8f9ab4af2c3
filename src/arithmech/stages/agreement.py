"""The method-agreement stage: do path patching, attribution patching, zero ablation and mediation agree?

Each method answers "which components carry the arithmetic?" in its own way; a conclusion that only one of
them supports is fragile. On the same prompts (the reference set of an identify run) this stage scores

    path            path patching (METHODS.md sec. 2) with the identify run's variant; importance = -effect
    attribution     its first-order estimate (patching/attribution.py); importance = -effect
    zero-ablation   zeroing a component's output (Yu & Ananiadou); importance = drop of the answer's
                    probability, mean over prompts. By default at the last token only (zero_positions "end"),
                    like the other three methods, which act at END; that is one decoding step per component on
                    the cached prompt. zero_positions "all" zeroes every position, as the neurons stage does
                    (one full forward pass per component and prompt: an hour for a 135M model on 2 CPU cores)
    mediation       causal mediation (Stolfo et al.) with the counterfactual prompt as the alternative; r' is
                    the model's own answer to the counterfactual (its template swaps the operator for an
                    unrelated symbol, so it has no true result); importance = median over pairs of the IE at
                    the last token (medians, since a pair with a tiny P*(r) can dominate a mean)

at two levels: heads (path, attribution, zero-ablation; mediation acts on whole layers, so it has no head
score) and layers, one site per attention layer and per MLP (attention layer = sum of its heads' effects for
the patching methods, all its heads zeroed together for zero-ablation). For every pair of methods it reports
the Spearman correlation and the top-k overlap (analysis/agreement.py).

Writes agreement.csv, importance.csv, agreement.png and metadata.json (last) into the output folder. An
undefined number is an empty cell: a Spearman correlation with a constant score, a top-k overlap with fewer
than k sites (agreement.csv), a site a method does not score (importance.csv: mediation has no head score,
and no score at all when the counterfactual moves no answer).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arithmech.analysis.agreement import agreement_table
from arithmech.data import tokenize_pairs
from arithmech.data.mediation_prompts import MediationPair
from arithmech.data.mediation_tokens import POSITION_CLASSES, TokenizedMediationPair
from arithmech.data.sampling import sample_pairs
from arithmech.errors import ConfigError
from arithmech.knockout.ablation import ablation_sources
from arithmech.knockout.batched import knockout_scores
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, all_components
from arithmech.patching.attribution import attribution_patch
from arithmech.patching.mediation import mediation_effects
from arithmech.patching.path import PatchingBatch, path_patch
from arithmech.patching.states import collect_end_states
from arithmech.patching.total import total_patched_logits
from arithmech.runs import (
    atomic_write_json,
    atomic_write_text,
    cell,
    csv_text,
    defined,
    defined_row,
    git_sha,
    package_versions,
)
from arithmech.stages.agreement_config import AgreementConfig
from arithmech.stages.identify_run import read_identify_run

logger = logging.getLogger(__name__)

LEVELS: tuple[str, ...] = ("head", "layer")


@dataclass
class AgreementResult:
    """Importance of every site by every method, and their pairwise agreement, per level."""

    sites: dict[str, list[str]]  # level -> site names
    importance: dict[str, dict[str, np.ndarray]]  # level -> method -> [site], NaN where a method has no score
    rows: list[dict[str, Any]]  # agreement_table rows with a "level" key
    out_dir: Path
    metadata: dict[str, Any]


@torch.no_grad()
def method_agreement(
    handle: ModelHandle, cfg: AgreementConfig, out_dir: str | Path, quiet: bool = False
) -> AgreementResult:
    """Score every head and layer by each method on the identify run's prompts and compare the rankings."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    run = read_identify_run(cfg.from_run, handle, one_answer_token="the method agreement")
    variant = run.metadata.get("config", {}).get("variant", "path")
    pairs, sample = sample_pairs(run.pairs, cfg.max_prompts, cfg.seed)
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    if len(t.pairs) < 2:
        raise ConfigError(f"the identify run {cfg.from_run!r} has fewer than 2 usable prompts; identify on more")
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    view, dims = handle.view, handle.dims
    components = all_components(dims)
    timings: dict[str, float] = {}
    mediation_pairs = 0
    scores: dict[str, torch.Tensor] = {}  # method -> [component] importance (heads and MLPs)
    layer_scores: dict[str, torch.Tensor] = {}  # method -> [2 * n_layers]: attention layers, then MLPs
    with tqdm(total=len(cfg.methods), desc="methods", unit="method", disable=quiet) as bar:
        for method in cfg.methods:
            start = time.perf_counter()
            bar.set_postfix_str(method)
            if method in ("path", "attribution"):
                patch = path_patch if method == "path" else attribution_patch
                scores[method] = -patch(view, batch, variant, batch_size=cfg.batch_size).effects
                layer_scores[method] = _layers_from_components(scores[method], dims.n_layers, dims.n_heads)
            elif method == "zero-ablation":
                scores[method], layer_scores[method] = _zero_ablation(
                    handle, batch, components, cfg.batch_size, cfg.zero_positions == "end"
                )
            else:
                layer_scores[method], mediation_pairs = _mediation_at_end(handle, batch)
            timings[f"{method}_s"] = time.perf_counter() - start
            bar.update(1)
    head_sites = [c.name for c in components if c.head is not None]
    is_head = torch.tensor([c.head is not None for c in components])
    layer_sites = [f"attn.{layer}" for layer in range(dims.n_layers)] + [
        f"mlp.{layer}" for layer in range(dims.n_layers)
    ]
    nan_heads = np.full(len(head_sites), np.nan)
    importance = {
        "head": {m: scores[m][is_head].numpy() if m in scores else nan_heads for m in cfg.methods},
        "layer": {m: layer_scores[m].numpy() for m in cfg.methods},
    }
    rows = []
    for level in LEVELS:
        scored = {m: v for m, v in importance[level].items() if not np.isnan(v).all()}
        if len(scored) >= 2:
            rows += [{"level": level, **row} for row in agreement_table(scored, cfg.ks)]
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(dims),
        "config": asdict(cfg),
        "from_run": str(run.path),
        "identify_runs": [run.record],
        "variant": variant,
        "counts": {"prompts": len(batch), "mediation_pairs": mediation_pairs},
        "prompts": sample,
        "timings": timings,
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    sites = {"head": head_sites, "layer": layer_sites}
    result = AgreementResult(sites, importance, rows, out, metadata)
    write_agreement_outputs(result, handle.source.get("model", "?"))
    return result


def _layers_from_components(importance: torch.Tensor, n_layers: int, n_heads: int) -> torch.Tensor:
    """[2 * n_layers] from [component] in all_components order (per layer: its heads, then its MLP)."""
    per_layer = importance.reshape(n_layers, n_heads + 1)  # [layer, heads + mlp]
    return torch.cat([per_layer[:, :n_heads].sum(1), per_layer[:, n_heads]])


@torch.no_grad()
def _zero_ablation(
    handle: ModelHandle, batch: PatchingBatch, components: list[Component], batch_size: int, end_only: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop of the answer probability with each component, and each whole attention layer, zeroed."""
    dims, view = handle.dims, handle.view
    if end_only:  # one decoding step per component, and per attention layer, on the cached prompt (total.py)
        ref = collect_end_states(view, batch.ref_ids, batch.ref_mask, batch.end, keep_cache=True)
        zeros = dataclasses.replace(ref, z=torch.zeros_like(ref.z), mlp_out=torch.zeros_like(ref.mlp_out))
        prob = total_patched_logits(view, batch, ref, zeros, read=_answer_prob).mean(1)  # [component]
        layers = total_patched_logits(view, batch, ref, zeros, read=_answer_prob, whole_layers=True).mean(1)
        answers = batch.answer_ids.to(ref.resid_final.device)
        intact = _answer_prob(view.vocab_logits(ref.resid_final), answers).mean()
        per_component, per_attention_layer = intact - prob, intact - layers
    else:
        layers_of = range(dims.n_layers)
        heads_of = [[c for c in components if c.layer == layer and c.head is not None] for layer in layers_of]
        sources = ablation_sources(view, batch, "zero", groups=[0] * len(batch))
        configs = [[], *([c] for c in components), *heads_of]  # baseline, each component, each attention layer
        prob = knockout_scores(view, batch, sources, configs, batch_size).mean_prob  # [config]
        drop = prob[0] - prob[1:]
        per_component, per_attention_layer = drop[: len(components)], drop[len(components) :]
    mlps = per_component.reshape(dims.n_layers, dims.n_heads + 1)[:, dims.n_heads]
    return per_component, torch.cat([per_attention_layer, mlps])


def _answer_prob(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    return logits.float().softmax(-1).gather(1, answers[:, None])[:, 0]


def _mediation_at_end(handle: ModelHandle, batch: PatchingBatch) -> tuple[torch.Tensor, int]:
    """Median over pairs of the IE of each attention layer and MLP at the last token [2 * n_layers], and the
    number of pairs (those whose counterfactual moves the model's answer)."""
    view = handle.view
    cf_answer = view.end_logits(batch.cf_ids, batch.cf_mask, batch.end).argmax(-1).cpu()  # [batch]
    items, ends = [], []
    for i in range(len(batch)):
        end = int(batch.end[i])
        if int(cf_answer[i]) == int(batch.answer_ids[i]):
            continue  # the counterfactual does not move the answer: IE's r' is undefined
        position_class = torch.zeros(end + 1, dtype=torch.long)
        position_class[end] = POSITION_CLASSES.index("last")
        pair = MediationPair("", "", "", "", "identify", "counterfactual", "", "")
        base, alt = batch.ref_ids[i, : end + 1], batch.cf_ids[i, : end + 1]
        items.append(
            TokenizedMediationPair(pair, base, alt, int(batch.answer_ids[i]), int(cf_answer[i]), position_class, None)
        )
        ends.append(end)
    if not items:
        logger.warning("mediation skipped: on every prompt the model answers the counterfactual as the reference")
        return torch.full((2 * view.dims.n_layers,), float("nan")), 0
    result = mediation_effects(view, items)  # ie [pair, component, layer, pos], components ("mlp", "attn")
    at_end = torch.stack([result.ie[i, :, :, end] for i, end in enumerate(ends)])  # [pair, component, layer]
    median = at_end.nanmedian(0).values  # [component, layer]
    attn, mlp = median[result.components.index("attn")], median[result.components.index("mlp")]
    return torch.cat([attn, mlp]), len(items)


def write_agreement_outputs(result: AgreementResult, model: str) -> None:
    """agreement.csv, importance.csv, agreement.png, then metadata.json."""
    from arithmech.report.agreement_plots import agreement_matrices

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    methods = list(result.metadata["config"]["methods"])
    atomic_write_text(out / "agreement.csv", csv_text([defined_row(r) for r in result.rows], float_format=".6f"))
    importance_rows = [
        {"level": level, "site": site, **{m: cell(defined(result.importance[level][m][i]), ".6g") for m in methods}}
        for level in LEVELS
        for i, site in enumerate(result.sites[level])
    ]
    atomic_write_text(out / "importance.csv", csv_text(importance_rows, float_format=".6f"))
    title = f"{result.metadata['counts']['prompts']} prompts: {model}"
    agreement_matrices(result.rows, methods, out / "agreement.png", title)
    atomic_write_json(out / "metadata.json", result.metadata)

