"""The analyze-numbers stage: how the model represents the numbers it adds, each reading judged by causal
patching (Kantamneni & Tegmark 2025; rival readings of Zhu et al., AlQuabeh et al., Levy & Geva).

Steps (definitions and formulas: `analysis/number_fits.py`, `patching/subspace.py`, `data/number_grid.py`)
1. grid: prompts over operands low..high-1 (one template, one few-shot prefix); one forward pass of the prompt
   set (with its answer, for "answered correctly") reads the residual entering every chosen layer at every
   site: each operand's token (per place on a digit-splitting tokenizer) and the last token. The activations of
   the correct prompts are averaged per value of the site's operand.
2. fits: per site and layer, the values split 80/20 (seeded) and every family fitted on the train values in
   a PCA of stated dimension, with its shuffled control (the basis permuted over the values).
3. patching: per site, each correct prompt gets a corrupted partner (its operand changed, at the site's place
   only); both run once (`base_run`), and every variant is a row joining at its layer: the whole layer
   patched (the clean residual), each family's patch h + Q Q^T (f(v) - h) (f the fit's out-of-sample prediction)
   and its patch of another value u, h + Q Q^T (f(u) - h) (the chance level its share is measured from), and
   the same for its shuffled controls, on the corrupted run; the fitted subspace ablated (to the mean over
   values) and a random subspace of the same
   rank on the clean run. LD = logit[clean answer token] - logit[corrupted answer token] at the read position.
4. control "other position": the a-families fitted at b's (last) token, patched there with a changed.

Writes, each atomically, metadata.json last:
    numbers_ld.csv        per site, layer and family: dim, rank, r2 (and shuffled), LD on train values (fit, its
                          patch of another value, shuffled, whole layer, clean, corrupted), restored share of
                          the whole layer's effect over the fit's patch of another value, LD on held-out
                          values, ablation LD and lost share (fitted vs random subspace), pairs, estimable and
                          the reason where not (too small a whole-layer effect: shares left empty)
    numbers_periods.json  per site and layer, the best helix by LD and its periods; per site the best layer
    numbers_ld.png        LD per layer by family, one panel per site, shuffled control dashed (+ .svg)
    numbers_helix.png     the operand means on the best helix's first circle, coloured by the operand, beside
                          the same for its shuffled control (+ .svg)
    metadata.json         model, config, range, sites, values (train, held out), counts, forward-pass
                          equivalents, timings, versions
"""

from __future__ import annotations

import math
import random
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech.analysis.number_fits import (
    Family,
    Fit,
    families,
    fit_family,
    fit_patch,
    heldout_split,
    principal_directions,
    random_subspace,
    select_families,
    shown_periods,
)
from arithmech.data.number_grid import NumberGrid, Partner, Site, default_range, number_grid, partner
from arithmech.data.templates import load_templates, select_templates
from arithmech.errors import ConfigError, DataError
from arithmech.models.context import check_fits_context
from arithmech.models.from_layer import layer_inputs
from arithmech.models.load import ModelHandle
from arithmech.models.view import ModelView
from arithmech.patching.subspace import base_run, logit_diff, patch_rows, row_cost
from arithmech.runs import git_sha, package_versions
from arithmech.stages.numbers_config import NumbersConfig, check_periods
from arithmech.stages.numbers_outputs import best_periods, verdicts, write_numbers_outputs


@dataclass(frozen=True)
class PatchedPair:
    """One clean prompt and its corrupted partner as patched at a site: what a check needs to redo its patches."""

    prompt: int  # index of the clean prompt in the grid
    value: int  # the clean operand value v (the site's operand)
    partner: Partner  # the corrupted prompt (its operand v') and the tokens read
    other: int  # the value u of every fit's patch of another value (the chance baseline)
    position: int  # the token position patched
    heldout: bool  # v is a held-out value


@dataclass
class NumbersResult:
    """What analyze-numbers computed, and where it wrote it."""

    rows: list[dict[str, Any]]
    """The rows of numbers_ld.csv."""
    periods: dict[str, Any]
    """numbers_periods.json."""
    verdicts: list[dict[str, Any]]
    """Per site: the family that wins at the best layer, by how much, against its controls."""
    sites: list[str]
    layers: list[int]
    means: dict[str, torch.Tensor]
    """site -> [value, layer, d_model] mean activation of the correct prompts (NaN where a value has none)."""
    fits: dict[tuple[str, int, str, int], Fit]
    """(site, layer, family, k) -> the fit (k = 0) or its k-th shuffled control (kept for the figures)."""
    pairs: dict[str, list[PatchedPair]]
    """site -> the pairs patched there, in the order of the LD tensors."""
    out_dir: Path
    metadata: dict[str, Any]


def _pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask [prompt, pos]."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids, mask


class _Cost:
    """Token-layers run, in the engine's units (`patching/subspace.row_cost`)."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers, self.parts = n_layers, {"grid": 0, "partners": 0, "bases": 0, "rows": 0}

    def forward(self, part: str, mask: torch.Tensor) -> None:
        self.parts[part] += int(mask.sum()) * self.n_layers


@torch.no_grad()
def _grid_pass(view: ModelView, grid: NumberGrid, layers: list[int], sites: list[Site], positions: dict[str, int],
               pad: int, batch_size: int, cost: _Cost,
               only_correct: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """(correct [prompt] bool, site -> means [value, layer, d_model] float64 over the prompts of each value, the
    correct ones only when `only_correct`; NaN where a value has none)."""
    n_values, d = grid.high - grid.low, view.dims.d_model
    sums = {s.name: torch.zeros(n_values, len(layers), d, dtype=torch.float64) for s in sites}
    counts = {s.name: torch.zeros(n_values, dtype=torch.float64) for s in sites}
    correct = []
    for start in range(0, len(grid.prompts), batch_size):
        chunk = grid.prompts[start : start + batch_size]
        ids, mask = _pad([p.ids + p.answer for p in chunk], pad)
        cost.forward("grid", mask)
        states = layer_inputs(view, ids, mask, [*layers, view.dims.n_layers])
        final = states[view.dims.n_layers]  # [prompt, pos, d_model]
        for i, p in enumerate(chunk):
            at = torch.arange(len(p.ids) - 1, len(p.ids) - 1 + len(p.answer))
            top = view.vocab_logits(final[i, at.to(final.device)]).argmax(-1).cpu()
            ok = bool((top == torch.tensor(p.answer)).all())
            correct.append(ok)
            if only_correct and not ok:
                continue
            for s in sites:
                value = (p.a if s.operand == "a" else p.b) - grid.low
                pos = positions[s.name] if s.token != "last" else p.positions["last"]
                sums[s.name][value] += torch.stack([states[layer][i, pos] for layer in layers]).double().cpu()
                counts[s.name][value] += 1
    means = {name: sums[name] / counts[name][:, None, None] for name in sums}  # NaN where a value has no prompt
    return torch.tensor(correct), means


@torch.no_grad()
def _partners(view: ModelView, tokenizer: Any, grid: NumberGrid, site: Site, kept: list[int], cfg: NumbersConfig,
              pad: int, cost: _Cost) -> list[tuple[int, Partner]]:  # fmt: skip
    """Up to max_prompts (prompt index, partner) whose corrupted prompt the model answers (when filtering)."""
    order = list(kept)
    random.Random(f"{cfg.seed}:numbers-order:{site.name}").shuffle(order)
    found: list[tuple[int, Partner]] = []
    for start in range(0, len(order), cfg.batch_size):
        found_here = [(i, partner(tokenizer, grid, grid.prompts[i], site, cfg.seed))
                      for i in order[start : start + cfg.batch_size]]  # fmt: skip
        chunk = [(i, p) for i, p in found_here if p is not None]
        if not chunk:
            continue
        if cfg.filter_correct:
            ids, mask = _pad([p.ids for _, p in chunk], pad)
            cost.forward("partners", mask)
            end = mask.sum(1) - 1
            top = view.end_logits(ids, mask, end).argmax(-1).cpu()
            chunk = [(i, p) for (i, p), t in zip(chunk, top.tolist(), strict=True) if t == p.bad]
        found += chunk
        if len(found) >= cfg.max_prompts:
            break
    return found[: cfg.max_prompts]


def _fits(means: torch.Tensor, grid: NumberGrid, fams: list[Family], train: torch.Tensor, pca_dim: int,
          layer_index: int, seed: int, site: str, shuffles: int) -> dict[tuple[str, int], Fit]:  # fmt: skip
    """Every family and its shuffled control at one layer (means [value, layer, d_model] of seen values)."""
    values = torch.arange(grid.low, grid.high)
    seen = ~torch.isnan(means[:, layer_index, 0])
    m = means[seen, layer_index]  # [seen value, d_model]
    vals, tr = values[seen], train[seen]
    pca = principal_directions(m, tr, pca_dim)
    out: dict[tuple[str, int], Fit] = {}
    for fam in fams:
        perm_gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{site}:{fam.name}".encode()))
        perms = [torch.randperm(int(tr.sum()), generator=perm_gen) for _ in range(shuffles)]
        for k in range(1 + (shuffles if fam.kind != "pca" else 0)):  # PCA has no order to shuffle
            fit = fit_family(m, vals, tr, fam, pca_dim, grid.low, grid.high, perms[k - 1] if k else None, pca)
            full = torch.full((len(values), m.shape[1]), float("nan"), dtype=torch.float64)
            pred = full.clone()
            full[seen], pred[seen] = fit.recon, fit.pred
            out[(fam.name, k)] = Fit(fit.family, fit.q, fit.mean, full, pred, fit.r2, fit.w)
    return out


def analyze_numbers(handle: ModelHandle, cfg: NumbersConfig, out_dir: str | Path, quiet: bool = False) -> NumbersResult:
    """Steps 1-4 of the module docstring; writes the folder."""
    with torch.no_grad():
        return _analyze(handle, cfg, Path(out_dir), quiet)


def _analyze(handle: ModelHandle, cfg: NumbersConfig, out: Path, quiet: bool) -> NumbersResult:
    from tqdm.auto import tqdm

    view, dims, tokenizer = handle.view, handle.dims, handle.tokenizer
    layers = sorted(cfg.layers) if cfg.layers is not None else list(range(dims.n_layers))
    if max(layers) >= dims.n_layers:
        raise ConfigError(f"layer {max(layers)} does not exist: the model has layers 0..{dims.n_layers - 1}")
    chosen = select_templates(load_templates(), (cfg.operation,), (cfg.formation,))
    if not chosen:
        raise DataError(f"no {cfg.formation} template for {cfg.operation}; choose another formation")
    template = chosen[0]
    low, high = default_range(tokenizer, template, cfg.low, cfg.high)
    check_periods(cfg.periods, low, high)
    start_time = time.perf_counter()
    grid = number_grid(tokenizer, template, low, high, cfg.few_shot, cfg.max_pairs, cfg.seed)
    check_fits_context(handle.model, max(len(p.ids) + len(p.answer) for p in grid.prompts))
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    sites = [s for s in grid.sites if cfg.sites is None or s.name in cfg.sites]
    known = [s.name for s in grid.sites]
    if cfg.sites is not None and (bad := [s for s in cfg.sites if s not in known]):
        raise ConfigError(f"site {bad[0]!r} is not one of this tokenizer's: {', '.join(known)}")
    b_site = next(s for s in reversed(grid.sites) if s.token == "b")
    control = Site(f"{b_site.name}|a", "a", None, "b")
    all_sites = [*sites, control]
    positions = {s.name: grid.prompts[0].positions[s.name] for s in grid.sites if s.token != "last"}
    positions[control.name] = positions[b_site.name]
    fams = select_families(families(low, high, grid.digit_split, cfg.periods or shown_periods(low, high)),
                           cfg.families)  # fmt: skip
    control_fams = [f for f in fams if f.kind in ("helix", "digit-circles", "pca")]
    control_fams = [f for f in control_fams if f.kind != "helix" or len(f.periods) == max(
        (len(g.periods) for g in control_fams if g.kind == "helix"), default=0)]  # fmt: skip
    cost = _Cost(dims.n_layers)

    correct, means = _grid_pass(view, grid, layers, all_sites, positions, pad, cfg.batch_size, cost, cfg.filter_correct)
    kept = correct.nonzero().flatten().tolist() if cfg.filter_correct else list(range(len(grid.prompts)))
    values = list(range(low, high))
    held = set(heldout_split(values, cfg.heldout, cfg.seed))
    train_mask = torch.tensor([v not in held for v in values])
    need = max(f.dim for f in fams) + 1
    rows: list[dict[str, Any]] = []
    fits_kept: dict[tuple[str, int, str, int], Fit] = {}
    site_counts: dict[str, Any] = {}
    patched: dict[str, list[PatchedPair]] = {}
    gen = torch.Generator().manual_seed(cfg.seed)
    for site in all_sites:
        seen = ~torch.isnan(means[site.name][:, 0, 0])
        n_train = int((seen & train_mask).sum())
        if n_train < need:
            raise ConfigError(
                f"site {site.name}: only {n_train} operand values have correct prompts to fit on, fewer than the "
                f"{need} the largest family needs; widen the range, raise max_pairs or add few-shot examples"
            )
        pca_dim = cfg.pca_dim if cfg.pca_dim is not None else n_train - 1
        if pca_dim > n_train:
            raise ConfigError(
                f"pca_dim {pca_dim} is above the {n_train} operand values the fits see at {site.name}; choose "
                f"{n_train} or less"
            )
        pairs = _partners(view, tokenizer, grid, site, kept, cfg, pad, cost)
        if not pairs:
            raise DataError(f"site {site.name}: no correct prompt has a corrupted partner the model answers; "
                            "use --no-filter-correct or a wider range")  # fmt: skip
        site_fams = control_fams if site is control else fams
        fits = {layer: _fits(means[site.name], grid, site_fams, train_mask, pca_dim, li, cfg.seed, site.name,
                             cfg.shuffles) for li, layer in enumerate(layers)}  # fmt: skip
        for layer in layers:
            for (name, k), fit in fits[layer].items():
                fits_kept[(site.name, layer, name, k)] = fit
        ld = _patch_site(view, grid, site, positions.get(site.name), pairs, layers, site_fams, fits, cfg, pad,
                         gen, cost, quiet, tqdm)  # fmt: skip
        is_held = torch.tensor([(grid.prompts[i].a if site.operand == "a" else grid.prompts[i].b) in held
                                for i, _ in pairs])  # fmt: skip
        patched[site.name] = [
            PatchedPair(i, (grid.prompts[i].a if site.operand == "a" else grid.prompts[i].b), p,
                        int(u) + grid.low, int(at), bool(h))
            for (i, p), u, at, h in zip(pairs, ld["other"].tolist(), ld["position"].tolist(), is_held.tolist(),
                                        strict=True)
        ]  # fmt: skip
        site_counts[site.name] = {"pairs": len(pairs), "heldout_pairs": int(is_held.sum()), "pca_dim": pca_dim,
                                  "train_values": n_train, "control": site is control}  # fmt: skip
        rows += _site_rows(site, site is control, layers, site_fams, fits, ld, is_held, cfg.min_effect)
    elapsed = time.perf_counter() - start_time
    mean_len = sum(len(p.ids) + len(p.answer) for p in grid.prompts) / len(grid.prompts)
    unit = dims.n_layers * mean_len * len(grid.prompts)  # token-layers of one forward pass of the prompt set
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "template": template.id,
        "range": {"low": low, "high": high, "digit_split": grid.digit_split,
                  "periods": list(cfg.periods or shown_periods(low, high))},  # fmt: skip
        "layers": layers,
        "sites": [s.name for s in all_sites],
        "control_site": control.name,
        "families": [f.name for f in fams],
        "values": {"train": [v for v in values if v not in held], "heldout": sorted(held)},
        "counts": {"grid_prompts": len(grid.prompts), "valid_pairs": grid.valid, "correct": int(correct.sum()),
                   "few_shot_examples": [list(e) for e in grid.examples], "sites": site_counts},  # fmt: skip
        "forward_pass_equivalents": {
            **{part: value / unit for part, value in cost.parts.items()},
            "total": sum(cost.parts.values()) / unit,
            "unit": "one forward pass of the grid's prompt set (with answers): n_layers x tokens",
        },
        "definitions": {
            "ld": "logit[clean answer token] - logit[corrupted answer token] at the read position (the first answer "
            "token where the two answers differ, the tokens before it given), mean over pairs whose clean value is "
            "a train value (ld_heldout: a held-out value)",
            "patch": "residual entering the layer at the site: h + Q Q^T (f(v) - h), h the corrupted run's, f(v) "
            "the fit's prediction of the clean value (leave-one-out for a train value, the fit's for a held-out one; "
            "PCA: the projection of the value's own mean activation), Q its subspace (analysis/number_fits.py)",
            "other": "the same fit's patch of another value u (seeded, neither the clean nor the corrupted one), "
            "h + Q Q^T (f(u) - h): the patch's chance level (it erases the corrupted value in Q as the fit's own "
            "patch does); ld_other is its mean LD",
            "layer": "the whole residual patched from the clean run",
            "restored": "sum_i (ld_i - other_i) x_i / sum_i (layer_i - other_i) x_i, x_i = layer_i - corrupted_i, "
            "over the train-value pairs: the share of the whole layer's effect over the fit's patch of another "
            "value that its patch of the clean value restores (0: chance, 1: all of it); empty where not "
            "estimable (estimable 0, with the reason)",
            "estimable": "the clean and corrupted LD differ by at least 1e-3 logits (RMS over pairs), the whole-layer "
            "patch moves LD by at least min_effect of that, and the whole layer beats the fit's patch of another "
            "value by at least min_effect of its own effect",
            "shuffled": "the same family fitted with its basis permuted over the train values (config shuffles "
            "seeded permutations, each measured from its own patch of another value; ld_shuffled averages their LD, "
            "restored_shuffled their shares, restored_shuffled_sd is the spread of the share between "
            "permutations)",
            "ablation_lost": "the same slope of (clean_i - ablated_i) on (clean_i - corrupted_i): the fitted subspace "
            "set to the mean over values on the clean run; random_lost: a random subspace of the same rank",
            "pca_heldout": "PCA's held-out LD projects the held-out value's own mean activation (not a prediction)",
        },
        "timings": {"numbers_s": elapsed},
        "versions": package_versions(),
        "identify_runs": [],
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    result = NumbersResult(rows, best_periods(rows), verdicts(rows), [s.name for s in all_sites], layers,
                           means, fits_kept, patched, out, metadata)  # fmt: skip
    write_numbers_outputs(result, handle.source.get("model", "?"), grid)
    return result


def _patch_site(view: ModelView, grid: NumberGrid, site: Site, pos: int | None, pairs: list[tuple[int, Partner]],
                layers: list[int], fams: list[Family], fits: dict[int, dict[tuple[str, int], Fit]],
                cfg: NumbersConfig, pad: int, gen: torch.Generator, cost: _Cost, quiet: bool,
                tqdm: Any) -> dict[str, torch.Tensor]:  # fmt: skip
    """LD of every variant of step 3: "clean", "corrupted" [pair]; "layer" [layer, pair]; ("fit" | "shuffled" |
    "ablate" | "random", family) [layer, pair] keyed "kind:family"; and "other", "position" [pair] (long): the
    value index of the patches of another value and the position patched."""
    n = len(pairs)
    out: dict[str, torch.Tensor] = {"clean": torch.empty(n), "corrupted": torch.empty(n),
                                    "layer": torch.empty(len(layers), n), "other": torch.empty(n, dtype=torch.long),
                                    "position": torch.empty(n, dtype=torch.long)}  # fmt: skip
    for fam in fams:
        tags = ("fit", *(f"shuffled{k}" for k in range(1, cfg.shuffles + 1)))
        for kind in ("ablate", "random", *tags, *(f"other-{t}" for t in tags)):
            out[f"{kind}:{fam.name}"] = torch.full((len(layers), n), math.nan)
    values = torch.tensor([(grid.prompts[i].a if site.operand == "a" else grid.prompts[i].b) - grid.low
                           for i, _ in pairs])  # fmt: skip
    others = _other_values(values, torch.tensor([p.value - grid.low for _, p in pairs]),
                           fits[layers[0]][(fams[0].name, 0)].pred[:, 0].isnan(), gen)  # fmt: skip
    # every draw before the passes, so that none depends on how the pairs are batched
    randoms = {(layer, fam.name): random_subspace(view.dims.d_model, fits[layer][(fam.name, 0)].rank, gen)
               for layer in layers for fam in fams}  # fmt: skip
    with tqdm(total=n, desc=f"patch {site.name}", unit="prompt", disable=quiet) as bar:
        for start in range(0, n, cfg.batch_size):
            chunk = pairs[start : start + cfg.batch_size]
            idx = torch.arange(start, start + len(chunk))
            clean_ids, mask = _pad([p.clean_ids for _, p in chunk], pad)
            corr_ids, _ = _pad([p.ids for _, p in chunk], pad)
            read = mask.sum(1) - 1
            good = torch.tensor([p.good for _, p in chunk])
            bad = torch.tensor([p.bad for _, p in chunk])
            clean, clean_final = base_run(view, clean_ids, mask)
            corr, corr_final = base_run(view, corr_ids, mask)
            cost.forward("bases", mask)
            cost.forward("bases", mask)
            rows_at = torch.arange(len(chunk))
            out["clean"][idx] = logit_diff(view, clean_final[rows_at, read], good, bad).float().cpu()
            out["corrupted"][idx] = logit_diff(view, corr_final[rows_at, read], good, bad).float().cpu()
            at = pos if pos is not None else int(read.min())  # the last site: every prompt's query end
            if pos is None:
                at_each = torch.tensor([len(grid.prompts[i].ids) - 1 for i, _ in chunk])
                if len(set(at_each.tolist())) > 1:
                    raise DataError("the prompts' last tokens fall at different positions; use one template")
                at = int(at_each[0])
            value, other = values[idx], others[idx]
            out["other"][idx], out["position"][idx] = other, at
            on_corr: list[tuple[str, int, torch.Tensor]] = []  # (key, layer index, vectors [prompt, d_model])
            on_clean: list[tuple[str, int, torch.Tensor]] = []
            for li, layer in enumerate(layers):
                h_x = corr.resid[layer, :, at].double().cpu()  # [prompt, d_model]
                h_c = clean.resid[layer, :, at].double().cpu()
                on_corr.append(("layer", li, h_c))
                for fam in fams:
                    for k in range(1 + (cfg.shuffles if fam.kind != "pca" else 0)):
                        fit = fits[layer][(fam.name, k)]
                        tag = f"shuffled{k}" if k else "fit"
                        on_corr.append((f"{tag}:{fam.name}", li, fit_patch(h_x, fit, value)))
                        on_corr.append((f"other-{tag}:{fam.name}", li, fit_patch(h_x, fit, other)))
                    fit = fits[layer][(fam.name, 0)]
                    on_clean.append((f"ablate:{fam.name}", li, h_c - ((h_c - fit.mean) @ fit.q) @ fit.q.T))
                    q = randoms[(layer, fam.name)]
                    on_clean.append((f"random:{fam.name}", li, h_c - ((h_c - fit.mean) @ q) @ q.T))
            for base, variants in ((corr, on_corr), (clean, on_clean)):
                if not variants:
                    continue
                k = len(chunk)
                prompt = torch.arange(k).repeat(len(variants))
                layer_of = torch.tensor([layers[li] for _, li, _ in variants]).repeat_interleave(k)
                vectors = torch.cat([v for _, _, v in variants])  # [variant * prompt, d_model]
                ld = patch_rows(view, base, at, prompt, layer_of, vectors, read, good, bad, cfg.max_rows)
                cost.parts["rows"] += row_cost(view.dims.n_layers, layer_of, int(mask.shape[1]) - at)
                for v, (key, li, _) in enumerate(variants):
                    target_t = out[key]
                    target_t[li, idx] = ld[v * k : (v + 1) * k]
            bar.update(len(chunk))
    return out


def _other_values(value: torch.Tensor, corrupted: torch.Tensor, unseen: torch.Tensor,
                  gen: torch.Generator) -> torch.Tensor:  # fmt: skip
    """[prompt] for each prompt a seeded value (an index, as `value`) other than its clean and corrupted ones
    among the seen values: the wrong value the fit's baseline patch writes."""
    pool = (~unseen).nonzero().flatten()
    out = []
    for v, c in zip(value.tolist(), corrupted.tolist(), strict=True):
        allowed = pool[(pool != v) & (pool != c)]
        out.append(int(allowed[int(torch.randint(len(allowed), (1,), generator=gen))]) if len(allowed) else v)
    return torch.tensor(out)


def _site_rows(site: Site, is_control: bool, layers: list[int], fams: list[Family],
               fits: dict[int, dict[tuple[str, int], Fit]], ld: dict[str, torch.Tensor],
               held: torch.Tensor, min_effect: float) -> list[dict[str, Any]]:  # fmt: skip
    """numbers_ld.csv rows of one site: the whole layer, then each family, per layer. A fit's share is measured
    from its own patch of another value (`restored_share`); a cell whose whole-layer effect is too small
    (`not_estimable`) keeps its LDs but leaves its shares empty, with the reason."""
    train = ~held

    def mean(x: torch.Tensor, which: torch.Tensor = train) -> float | None:
        return float(x[which].mean()) if bool(which.any()) and not bool(x.isnan().any()) else None

    rows = []
    clean, corr = ld["clean"], ld["corrupted"]
    for li, layer in enumerate(layers):
        whole = ld["layer"][li]
        why = not_estimable(clean, corr, whole, corr, train, min_effect)
        base = {"site": site.name, "variable": site.operand, "control": int(is_control), "layer": layer,
                "ld_layer": mean(whole), "ld_clean": mean(clean), "ld_corrupted": mean(corr),
                "ld_layer_heldout": mean(whole, held), "pairs": int(train.sum()),
                "heldout_pairs": int(held.sum())}  # fmt: skip
        rows.append({**dict.fromkeys(COLUMNS), **base, "family": "layer", "kind": "layer", "ld": mean(whole),
                     "restored": None if why else 1.0, "ld_heldout": base["ld_layer_heldout"],
                     "estimable": int(not why), "reason": why})  # fmt: skip
        for fam in fams:
            fit = fits[layer][(fam.name, 0)]
            value, other = ld[f"fit:{fam.name}"][li], ld[f"other-fit:{fam.name}"][li]
            n_shuffles = len(shuffles_of(fits[layer], fam))
            runs = [ld[f"shuffled{k}:{fam.name}"][li] for k in range(1, n_shuffles + 1)]
            others = [ld[f"other-shuffled{k}:{fam.name}"][li] for k in range(1, n_shuffles + 1)]
            shuffled = torch.stack(runs).mean(0) if runs else torch.full_like(value, math.nan)  # [pair]
            cell_why = why or not_estimable(clean, corr, whole, other, train, min_effect)

            each, each_held = ([None if why else restored_share(r, o, whole, which, clean, corr, min_effect)
                                for r, o in zip(runs, others, strict=True)] for which in (train, held))  # fmt: skip
            spread = [x for x in each if x is not None]
            ablated, rand = ld[f"ablate:{fam.name}"][li], ld[f"random:{fam.name}"][li]
            rows.append({
                **dict.fromkeys(COLUMNS), **base, "family": fam.name, "kind": fam.kind,
                "periods": "-".join(map(str, fam.periods)), "dim": fam.dim, "rank": fit.rank, "r2": fit.r2,
                "r2_shuffled": _mean([f.r2 for f in shuffles_of(fits[layer], fam)]), "ld": mean(value),
                "ld_other": mean(other), "ld_shuffled": mean(shuffled),
                "restored": None if cell_why else restored_share(value, other, whole, train, clean, corr, min_effect),
                "restored_shuffled": _mean_of(each),
                "restored_shuffled_sd": float(torch.tensor(spread).std()) if len(spread) > 1 else None,
                "ld_heldout": mean(value, held), "ld_shuffled_heldout": mean(shuffled, held),
                "restored_heldout": None if why else restored_share(value, other, whole, held, clean, corr, min_effect),
                "restored_shuffled_heldout": _mean_of(each_held),
                "ld_ablated": mean(ablated), "ablation_lost": share(clean - ablated + corr, corr, clean, train),
                "ld_random": mean(rand), "random_lost": share(clean - rand + corr, corr, clean, train),
                "estimable": int(not cell_why), "reason": cell_why,
            })  # fmt: skip
    return rows


def _rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt()) if x.numel() else 0.0


MIN_LOGITS = 1e-3
"""Clean and corrupted runs closer than this (RMS over pairs, in logits) leave nothing to restore."""


def not_estimable(clean: torch.Tensor, corr: torch.Tensor, whole: torch.Tensor, base: torch.Tensor,
                  which: torch.Tensor, min_effect: float) -> str | None:  # fmt: skip
    """Why a restored share over the pairs `which` would mean nothing, or None. The clean and corrupted runs
    must differ (RMS over pairs at least `MIN_LOGITS`), the whole-layer patch must move LD by at least
    `min_effect` of that (RMS of whole - corrupted over pairs), and, for a fit (base: its patch of another
    value), the whole layer must beat base along its own effect by `min_effect` (`restored_share`'s
    denominator); else a ratio such as 4.5 is noise over a near-zero effect."""
    if not bool(which.any()):
        return "no pairs"
    total = _rms((clean - corr)[which])
    if total < MIN_LOGITS:
        return f"clean and corrupted LD differ by {total:.2g} logits (RMS over pairs), under {MIN_LOGITS:g}"
    effect = _rms((whole - corr)[which])
    if effect < min_effect * total:
        return (f"the whole-layer patch moves LD by {effect:.2g} (RMS over pairs), under min_effect {min_effect:g} "
                f"of the clean-corrupted difference {total:.2g}")
    if base is not corr and (gain := share(whole, base, whole, which, corr)) is not None and gain < min_effect:
        return (f"the fit's patch of another value already gives {1 - gain:.0%} of the whole layer's effect, "
                f"leaving under min_effect {min_effect:g} to restore")
    return None


def restored_share(value: torch.Tensor, base: torch.Tensor, whole: torch.Tensor, which: torch.Tensor,
                   clean: torch.Tensor, corr: torch.Tensor, min_effect: float) -> float | None:  # fmt: skip
    """share(value) / share(whole), both from `base` (the fit's patch of another value) and along the whole
    layer's per-pair effect x = whole - corr: sum_i (value_i - base_i) x_i / sum_i (whole_i - base_i) x_i over
    the pairs `which`; None where `not_estimable`. 1 for a fit whose patch is the clean activation, 0 in
    expectation for one whose patch of the clean value is no better than of another (a wrong-order fit): its two
    patches are exchangeable, and x shares no term with them. Measured from the corrupted run instead, any patch
    that erases the corrupted value in its subspace would score about one half."""
    if bool(value[which].isnan().any()) or not_estimable(clean, corr, whole, base, which, min_effect):
        return None
    top, bottom = share(value, base, whole, which, corr), share(whole, base, whole, which, corr)
    return None if top is None or bottom is None else top / bottom


def _mean_of(values: list[float | None]) -> float | None:
    kept = [x for x in values if x is not None]
    return sum(kept) / len(kept) if kept and len(kept) == len(values) else None


COLUMNS = (
    "site",
    "variable",
    "control",
    "layer",
    "family",
    "kind",
    "periods",
    "dim",
    "rank",
    "r2",
    "r2_shuffled",
    "ld",
    "ld_other",
    "ld_shuffled",
    "ld_layer",
    "ld_clean",
    "ld_corrupted",
    "restored",
    "restored_shuffled",
    "restored_shuffled_sd",
    "ld_heldout",
    "ld_shuffled_heldout",
    "restored_heldout",
    "restored_shuffled_heldout",
    "ld_layer_heldout",
    "ld_ablated",
    "ablation_lost",
    "ld_random",
    "random_lost",
    "pairs",
    "heldout_pairs",
    "estimable",
    "reason",
)
"""The columns of numbers_ld.csv, in order (the whole layer's row leaves the fit columns empty)."""


def shuffles_of(fits: dict[tuple[str, int], Fit], fam: Family) -> list[Fit]:
    """The shuffled controls of a family at one layer, in order."""
    return [fit for (name, k), fit in sorted(fits.items(), key=lambda kv: kv[0][1]) if name == fam.name and k > 0]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def share(value: torch.Tensor, base: torch.Tensor, whole: torch.Tensor, which: torch.Tensor,
          corr: torch.Tensor | None = None) -> float | None:
    """The least-squares slope sum_i (value_i - base_i) x_i / sum_i x_i^2, x = whole - base (or whole - corr
    when given) over the pairs `which`: the share of the whole patch's per-pair effect that a variant
    reproduces (the ratio of mean effects when every pair's effect is alike; defined whatever their signs).
    None when the whole patch changes nothing."""
    x = (whole - (base if corr is None else corr))[which].double()
    effect = (value - base)[which].double()
    denominator = float((x**2).sum())
    if bool(effect.isnan().any()):
        return None
    return float((effect * x).sum()) / denominator if denominator > 1e-12 else None
