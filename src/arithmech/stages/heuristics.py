"""The heuristics stage: heuristic neurons (Nikankin et al., ICLR 2025) of one model, into one folder.

Steps, per operation:
1. grid: every operand pair (A, B) of 0..grid_size-1 whose result is a single-token number (grid_size:
   every single-token number of the tokenizer, `data/number_tokens.py`; a seeded sample above max_pairs),
   one template, the same few-shot prefix for every pair (`data/operand_grid.py`);
2. scan: one forward pass per batch of prompts reads every neuron of the chosen layers at END: its activation
   m and its direct effect DE on the answer's logit (`neurons/heuristic_scan.py`); the pairs the model
   answers are kept (unless filter_correct is off);
3. classify: every neuron's best operand template and best result template, each scored on its activation and
   classified or not, and the same with its activations permuted over the pairs (each family's null)
   (`neurons/heuristic_templates.py`, where the score and the null are defined);
4. ablate: per prompt the top-k neurons per layer by DE vs k random ones (n_random seeds), mean and zero.

Writes, each atomically, metadata.json last:
    grid.csv                 operation, a, b, result, answer token, answered
    neurons.csv              per operation and neuron, for each family (operand_*, result_*): best template,
                             family, direction, score, p_value, classified; strong (top 1% of its layer by mean
                             |DE|), mean m, mean DE, mean |DE|
    layers.csv               per operation and layer, for each family: classified (all; strong ones) and its null
                             fraction; the overlap of the families: neurons classified by operand templates only,
                             result templates only, both (overlap_*), and both's null fraction; the share of each
                             template family
    ablation.csv             per operation, ablation, selection (top/random/none), seed, k: accuracy, answer_prob
    patterns.csv             the strongest neurons' maps over the grid (thumbnails' numbers)
    heuristic_types.png/svg  classified fraction per layer by template family, and classified by both families,
                             each with its null marked
    activation_patterns.png/svg  A x B activation images of the strongest neurons (paper Figure 3 style)
    ablation.png/svg         accuracy over k, top vs random, mean and zero, 1% of a layer marked
An operation with fewer than 2 answered pairs is left out (named in metadata.json, "skipped").
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech.data.number_tokens import NumberTokens, single_token_numbers
from arithmech.data.operand_grid import OperandGrid, operand_grid
from arithmech.data.templates import load_templates, select_templates
from arithmech.data.tokens import TokenizedPairs, tokenize_pairs
from arithmech.errors import ConfigError, DataError
from arithmech.models.context import check_fits_context
from arithmech.models.load import ModelHandle
from arithmech.neurons.heuristic_scan import NeuronScan, ablation_sweep, check_width, scan_neurons
from arithmech.neurons.heuristic_templates import (
    ALPHA,
    FAMILIES,
    GROUPS,
    classify_families,
    family_overlap,
    family_templates,
    heuristic_templates,
    shuffled_best,
)
from arithmech.runs import atomic_write_json, atomic_write_text, csv_text, git_sha, package_versions
from arithmech.stages.heuristics_config import HeuristicsConfig, default_ks

STRONG_SHARE = 0.01
"""The strong neurons of a layer: its top 1% by mean |DE| (about the share Nikankin et al. find at work)."""


@dataclass
class OperationResult:
    """One operation's grid, scan (answered pairs only) and tables."""

    grid: OperandGrid
    answer_ids: list[int]  # [grid pair] the answer's token
    answered: torch.Tensor  # [grid pair] bool
    kept: list[int]
    scan: NeuronScan  # on the kept pairs
    neurons: list[dict[str, Any]]
    layers: list[dict[str, Any]]
    ablation: list[dict[str, Any]]
    strongest: list[tuple[int, int]]  # (layer, neuron) by mean |DE|

    def summary(self, k: int) -> dict[str, float]:
        """Per family ("operand", "result"), and for both families ("both"): share of neurons classified and its
        null ("<family>_null");
        accuracy intact and with k neurons per layer ablated (top by DE or random, mean over seeds; NaN where k
        was not run)."""
        n = sum(r["neurons"] for r in self.layers)
        out: dict[str, float] = {"base": next(r["accuracy"] for r in self.ablation if r["selection"] == "none")}
        for group in GROUPS:
            out[group] = sum(r[f"{group}_classified"] for r in self.layers) / n
            out[f"{group}_null"] = sum(r[f"{group}_null_fraction"] * r["neurons"] for r in self.layers) / n
        out["both"] = sum(r["overlap_both"] for r in self.layers) / n
        out["both_null"] = sum(r["overlap_both_null_fraction"] * r["neurons"] for r in self.layers) / n
        for selection in ("top", "random"):
            for ablation in ("mean", "zero"):
                values = [r["accuracy"] for r in self.ablation
                          if (r["selection"], r["ablation"], r["k"]) == (selection, ablation, k)]  # fmt: skip
                out[f"{selection}_{ablation}"] = sum(values) / len(values) if values else float("nan")
        return out


@dataclass
class HeuristicsResult:
    operations: dict[str, OperationResult]
    layers: tuple[int, ...]
    ks: tuple[int, ...]
    out_dir: Path
    metadata: dict[str, Any]


def default_layers(n_layers: int) -> tuple[int, ...]:
    """The second half of the model (the paper's heuristic neurons sit in the middle and late MLPs)."""
    return tuple(range(n_layers // 2, n_layers))


def grid_numbers(tokenizer: Any, cfg: HeuristicsConfig) -> tuple[NumberTokens, int]:
    """The tokenizer's single-token numbers, and the operands of the grid (0..size-1)."""
    numbers = single_token_numbers(tokenizer, "1 + 1 = ")
    size = cfg.grid_size or numbers.count
    if size > numbers.count:
        raise ConfigError(
            f"grid_size {size} is larger than the tokenizer's single-token numbers (0..{numbers.count - 1}); "
            f"use --grid-size {numbers.count} or less"
        )
    return numbers, size


def operation_grid(
    tokenizer: Any, cfg: HeuristicsConfig, operation: str, grid_range: tuple[NumberTokens, int]
) -> tuple[OperandGrid, TokenizedPairs]:
    """Step 1 for `operation`: its operand grid over `grid_numbers`, and its prompts tokenized (what the memory
    budget reads too)."""
    numbers, size = grid_range
    chosen = select_templates(load_templates(), (operation,), (cfg.formation,))
    if not chosen:
        raise DataError(f"no {cfg.formation} template for {operation}; choose another formation")
    grid = operand_grid(chosen[0], size, numbers.count, cfg.few_shot, cfg.max_pairs, cfg.seed)
    tokenized, _ = tokenize_pairs(tokenizer, grid.pairs, counterfactual_required=False)
    return grid, tokenized


@torch.no_grad()
def heuristics(
    handle: ModelHandle, cfg: HeuristicsConfig, out_dir: str | Path, quiet: bool = False
) -> HeuristicsResult:
    """Steps 1-4 of the module docstring for every operation of `cfg`; writes the folder."""
    from tqdm.auto import tqdm

    out, view, dims = Path(out_dir), handle.view, handle.dims
    layers = cfg.layers or default_layers(dims.n_layers)
    if max(layers) >= dims.n_layers:
        raise ConfigError(f"layer {max(layers)} does not exist: the model has layers 0..{dims.n_layers - 1}")
    layers = tuple(sorted(layers))
    width = check_width(view, layers)
    numbers, size = grid_numbers(handle.tokenizer, cfg)
    ks = tuple(sorted(set(cfg.ks))) if cfg.ks else default_ks(width)
    if max(ks) > width:
        raise ConfigError(f"k {max(ks)} is more than the {width} neurons of a layer; choose ks up to {width}")
    start = time.perf_counter()
    results: dict[str, OperationResult] = {}
    skipped: dict[str, str] = {}
    for operation in cfg.operations:
        grid, tokenized = operation_grid(handle.tokenizer, cfg, operation, (numbers, size))
        check_fits_context(handle.model, tokenized.ref_ids.shape[1])
        if len(tokenized.pairs) != len(grid.pairs):
            raise DataError(f"{len(grid.pairs) - len(tokenized.pairs)} {operation} grid prompts could not be tokenized")
        with tqdm(total=len(grid.pairs), desc=f"scan {operation}", unit="prompt", disable=quiet) as bar:
            scan = scan_neurons(view, tokenized, layers, cfg.batch_size, progress=bar.update)
        answered = scan.correct(tokenized.answer_ids)
        kept = answered.nonzero().flatten().tolist() if cfg.filter_correct else list(range(len(grid.pairs)))
        if len(kept) < 2:
            skipped[operation] = f"{len(kept)} of {len(grid.pairs)} grid pairs answered"
            continue
        idx = torch.tensor(kept)
        scan = NeuronScan(layers, scan.activation[idx], scan.direct_effect[idx], scan.top_token[idx])
        operands = torch.tensor([grid.operands[i] for i in kept])
        results_t = torch.tensor([grid.results[i] for i in kept])
        neuron_rows, layer_rows = _classify(operation, scan, operands, results_t, cfg)
        batch = tokenized.take(kept)
        n_rows = cfg.sweep_configurations(ks) * len(kept)
        with tqdm(total=n_rows, desc=f"ablate {operation}", unit="row", disable=quiet) as bar:
            sweep = ablation_sweep(view, batch, scan.direct_effect, scan.activation.mean(0), layers, ks, cfg.n_random,
                                   cfg.seed, cfg.ablations, cfg.batch_size, progress=bar.update)  # fmt: skip
        ablation = [{"operation": operation, **row, "fraction_of_layer": row["k"] / width, "prompts": len(kept)}
                    for row in sweep]  # fmt: skip
        strength = scan.direct_effect.abs().mean(0).flatten()  # [layer * d_mlp]
        top = strength.topk(min(cfg.top_neurons, len(strength))).indices.tolist()
        strongest = [(layers[i // width], i % width) for i in top]
        results[operation] = OperationResult(
            grid, tokenized.answer_ids.tolist(), answered, kept, scan, neuron_rows, layer_rows, ablation, strongest
        )
    if not results:
        raise DataError(
            f"the model answers too few grid pairs of every operation "
            f"({'; '.join(f'{k}: {v}' for k, v in skipped.items())}); "
            "use --no-filter-correct or more few-shot examples"
        )
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "layers": list(layers),
        "d_mlp": width,
        "ks": list(ks),
        "one_percent_k": max(1, round(0.01 * width)),
        "number_tokens": {"count": numbers.count, "context": numbers.context},
        "grid": {op: {"template": r.grid.template_id, "size": r.grid.size, "valid_pairs": r.grid.valid,
                      "pairs": len(r.grid.pairs), "answered": int(r.answered.sum()), "kept": len(r.kept),
                      "few_shot_examples": [list(e) for e in r.grid.examples]}
                 for op, r in results.items()},  # fmt: skip
        "skipped": skipped,
        "classification": {"threshold": cfg.threshold, "alpha": ALPHA, "strong_share": STRONG_SHARE,
                           "families": list(GROUPS),
                           "map": "every template on the activation m at END; the answer enters a result template "
                                  "only through its set of pairs",
                           "null": "each neuron's activations permuted over the pairs (seeded, one permutation per "
                                   "neuron), classified the same way, per family",
                           "overlap": "the families are not exclusive: layers.csv counts the neurons classified by "
                                      "operand templates only, result templates only and both (overlap_*); both is "
                                      "read against the null's neurons classified by both families"},
        "timings": {"heuristics_s": time.perf_counter() - start},
        "versions": package_versions(),
        "identify_runs": [],  # it reads no identify run, so no rerun of one makes it stale
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    result = HeuristicsResult(results, layers, ks, out, metadata)
    write_outputs(result, handle.source.get("model", "?"))
    return result


def _classify(
    operation: str, scan: NeuronScan, operands: torch.Tensor, results: torch.Tensor, cfg: HeuristicsConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """neurons.csv and layers.csv rows of one operation."""
    templates = heuristic_templates(operands, results)
    sizes = {g: len(idx) for g, idx in family_templates(templates).items()}
    neuron_rows, layer_rows = [], []
    for i, layer in enumerate(scan.layers):
        act, de = scan.activation[:, i].T, scan.direct_effect[:, i].T  # [d_mlp, pair]
        best = classify_families(act, templates)
        null = shuffled_best(act, templates, cfg.seed + layer)
        classified = {g: best[g].classified(cfg.threshold) for g in GROUPS}
        strength = de.abs().mean(1)  # [d_mlp]
        n = len(strength)
        n_strong = max(1, round(STRONG_SHARE * n))
        strong = torch.zeros(n, dtype=torch.bool)
        strong[strength.topk(n_strong).indices] = True
        families: list[str] = []
        for k in range(n):
            row: dict[str, Any] = {"operation": operation, "layer": layer, "neuron": k}
            for g in GROUPS:
                t = templates[int(best[g].template[k])] if sizes[g] else None
                ok = bool(classified[g][k])
                if ok and t is not None:
                    families.append(t.family)
                row.update({f"{g}_template": t.name if t else "", f"{g}_family": t.family if t else "",
                            f"{g}_direction": "top" if bool(best[g].top[k]) else "bottom",
                            f"{g}_score": float(best[g].score[k]), f"{g}_p_value": float(best[g].p_value[k]),
                            f"{g}_classified": int(ok)})  # fmt: skip
            row.update({"strong": int(strong[k]), "mean_activation": float(act[k].mean()),
                        "mean_direct_effect": float(de[k].mean()), "mean_abs_direct_effect": float(strength[k])})
            neuron_rows.append(row)
        layer_row: dict[str, Any] = {"operation": operation, "layer": layer, "neurons": n,
                                     "strong_neurons": n_strong}  # fmt: skip
        for g in GROUPS:
            layer_row.update({
                f"{g}_templates": sizes[g], f"{g}_classified": int(classified[g].sum()),
                f"{g}_fraction": float(classified[g].float().mean()),
                f"{g}_null_fraction": float(null[g].classified(cfg.threshold).float().mean()),
                f"{g}_strong_fraction": float(classified[g][strong].float().mean()),
            })  # fmt: skip
        overlap = family_overlap(classified)
        null_both = family_overlap({g: null[g].classified(cfg.threshold) for g in GROUPS})["both"]
        layer_row.update({f"overlap_{name}": int(mask.sum()) for name, mask in overlap.items()})
        layer_row["overlap_both_null_fraction"] = float(null_both.float().mean())
        layer_row.update({f"family_{f}": sum(x == f for x in families) / n for f in FAMILIES})
        layer_rows.append(layer_row)
    return neuron_rows, layer_rows


def write_outputs(result: HeuristicsResult, model: str) -> None:
    """Every table and figure of the stage, then metadata.json."""
    from arithmech.report.heuristic_plots import ablation_curves, activation_patterns, heuristic_types

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    ops = result.operations
    grid_rows = [{"operation": op, "a": a, "b": b, "result": c, "answer_token": int(t), "answered": int(ok)}
                 for op, r in ops.items()
                 for (a, b), c, t, ok in zip(r.grid.operands, r.grid.results, r.answer_ids, r.answered.tolist(),
                                             strict=True)]  # fmt: skip
    atomic_write_text(out / "grid.csv", csv_text(grid_rows))
    atomic_write_text(out / "neurons.csv", csv_text([x for r in ops.values() for x in r.neurons], float_format=".5g"))
    layer_rows = [x for r in ops.values() for x in r.layers]
    atomic_write_text(out / "layers.csv", csv_text(layer_rows, float_format=".5g"))
    ablation_rows = [x for r in ops.values() for x in r.ablation]
    atomic_write_text(out / "ablation.csv", csv_text(ablation_rows, float_format=".5g"))
    pattern_rows = []
    for op, r in ops.items():
        best = {(x["layer"], x["neuron"]): x for x in r.neurons}
        for rank, (layer, neuron) in enumerate(r.strongest, 1):
            i = result.layers.index(layer)
            for j, p in enumerate(r.kept):
                a, b = r.grid.operands[p]
                pattern_rows.append({"operation": op, "rank": rank, "layer": layer, "neuron": neuron, "a": a, "b": b,
                                     "activation": float(r.scan.activation[j, i, neuron]),
                                     "direct_effect": float(r.scan.direct_effect[j, i, neuron]),
                                     **{f"{g}_{key}": best[(layer, neuron)][f"{g}_{key}"] for g in GROUPS
                                        for key in ("template", "score", "classified")}})  # fmt: skip
    atomic_write_text(out / "patterns.csv", csv_text(pattern_rows, float_format=".5g"))
    heuristic_types(layer_rows, FAMILIES, out / "heuristic_types.png", f"heuristic neurons per layer: {model}")
    activation_patterns(pattern_rows, out / "activation_patterns.png",
                        f"activation over the operand grid, strongest neurons by mean |DE|: {model}")  # fmt: skip
    ablation_curves(ablation_rows, result.metadata["one_percent_k"], out / "ablation.png",
                    f"ablating k neurons per layer of {result.layers[0]}-{result.layers[-1]}: {model}")  # fmt: skip
    atomic_write_json(out / "metadata.json", result.metadata)
