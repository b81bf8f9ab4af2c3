"""The analyze-numbers stage: how the model represents the numbers it adds, each reading judged by causal
patching (Kantamneni & Tegmark 2025; rival readings of Zhu et al., AlQuabeh et al., Levy & Geva).

Steps (formulas: `analysis/number_fits.py`, `analysis/restored_share.py`, `patching/subspace.py`,
`data/number_grid.py`), each in its own module; this one joins them and writes the metadata
1. grid (`numbers_grid.py`): prompts over operands low..high-1 (one template, one few-shot prefix); one forward
   pass of the prompt set (with its answer, for "answered correctly") reads the residual entering every chosen
   layer at every site: each operand's token (per place on a digit-splitting tokenizer) and the last token. The
   activations of the correct prompts are averaged per value of the site's operand.
2. fits (`analysis/number_fits.fit_families`): per site and layer, the values split 80/20 (seeded) and every
   family fitted on the train values in a PCA of stated dimension, with its shuffled control (the basis
   permuted over the values).
3. patching (`numbers_patching.py`): per site, each correct prompt gets a corrupted partner (its operand
   changed, at the site's place only); both run once (`base_run`), and every variant is a row joining at its
   layer: the whole layer patched (the clean residual), each family's patch h + Q Q^T (f(v) - h) (f the fit's
   out-of-sample prediction) and its patch of another value u, h + Q Q^T (f(u) - h) (the chance level its share
   is measured from), and the same for its shuffled controls, on the corrupted run; the fitted subspace ablated
   (to the mean over values) and a random subspace of the same rank on the clean run. LD = logit[clean answer
   token] - logit[corrupted answer token] at the read position.
4. control "other position": the a-families fitted at b's (last) token, patched there with a changed (when a
   site reads a at its own token).
5. table and verdict (`numbers_table.py`, `numbers_verdict.py`), files (`numbers_outputs.py`).
6. the Clock (site "clock", `numbers_clock.py`): helix(a+b), helix(a, b), helix(a, b, a+b) and PCA of equal size
   fitted to each correct prompt's last-token residual and patched as in 3; with an identify run, its key heads
   classified as a,b, a+b, mixed or unexplained heads by the share of their effect each helix explains
   (`numbers_heads.py`).

Writes, each atomically, metadata.json last:
    numbers_ld.csv        per site, layer and family: dim, rank, r2 (and shuffled), LD on train values (fit, its
                          patch of another value, shuffled, whole layer, clean, corrupted), restored share of
                          the whole layer's effect over the fit's patch of another value, LD on held-out
                          values, ablation LD and lost share (fitted vs random subspace), pairs, estimable and
                          the reason where not (too small a whole-layer effect: shares left empty)
    numbers_periods.json  per site and layer, the best helix by LD and its periods; per site the best layer
    numbers_clock.csv     the Clock: numbers_ld.csv's columns for the site "clock" (variable "a,b")
    numbers_clock_heads.csv  with an identify run: per head its c_ab, c_sum, c_joint (train, held out), class
    numbers_ld.png        LD per layer by family, one panel per site, shuffled control dashed (+ .svg)
    numbers_helix.png     the operand means on the best helix's first circle, coloured by the operand, beside
                          the same for its shuffled control (+ .svg)
    metadata.json         model, config, range, sites, values (train, held out), counts, forward-pass
                          equivalents, the Clock's verdict and head order, timings, versions, the identify run
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from arithmech.analysis.clock_fits import clock_families
from arithmech.analysis.number_fits import (
    Family,
    Fit,
    families,
    fit_families,
    heldout_split,
    seeded,
    select_families,
    shown_periods,
)
from arithmech.data.number_grid import NumberGrid, Partner, Site, default_range, number_grid
from arithmech.data.templates import load_templates, select_templates
from arithmech.errors import ConfigError, DataError
from arithmech.models.context import check_fits_context
from arithmech.models.load import ModelHandle
from arithmech.models.sites import parse_components
from arithmech.runs import git_sha, package_versions
from arithmech.stages.identify_run import IdentifyRun, read_identify_run
from arithmech.stages.numbers_clock import CLOCK_SITE, clock_site, sum_indices
from arithmech.stages.numbers_config import CLOCK, NumbersConfig, check_periods
from arithmech.stages.numbers_grid import LastToken, TokenLayers, find_partners, grid_means
from arithmech.stages.numbers_heads import classify_heads, order_sentence
from arithmech.stages.numbers_outputs import write_numbers_outputs
from arithmech.stages.numbers_patching import patch_site, value_indices
from arithmech.stages.numbers_table import site_rows
from arithmech.stages.numbers_verdict import best_periods, verdict_sentence, verdicts


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
    """(site, layer, family, k) -> the fit (k = 0) or its k-th shuffled control (kept for the figures: its
    subspace and W, without its prediction)."""
    pairs: dict[str, list[PatchedPair]]
    """site -> the pairs patched there, in the order of the LD tensors."""
    out_dir: Path
    metadata: dict[str, Any]
    clock: ClockResult | None = None
    """The Clock at the last token and its heads (None when the clock site is left out)."""


@dataclass
class ClockResult:
    """The Clock's tables (`numbers_clock.py`, `numbers_heads.py`) and what metadata.json records of them."""

    rows: list[dict[str, Any]]
    """numbers_clock.csv: the last token's helix(a+b), helix(a, b), helix(a, b, a+b) and PCA per layer."""
    verdicts: list[dict[str, Any]]
    """The verdict of those rows (`numbers_verdict.verdicts`)."""
    heads: list[dict[str, Any]]
    """numbers_clock_heads.csv (empty without an identify run)."""
    metadata: dict[str, Any]
    identify_run: dict[str, Any] | None
    """The record of the identify run read (`lineage.identify_record`), None without one."""


def analyze_numbers(handle: ModelHandle, cfg: NumbersConfig, out_dir: str | Path, quiet: bool = False) -> NumbersResult:
    """Steps 1-4 of the module docstring; writes the folder."""
    with torch.no_grad():
        return _analyze(handle, cfg, Path(out_dir), quiet)


def value_grid(tokenizer: Any, cfg: NumbersConfig) -> tuple[int, int, NumberGrid]:
    """The values low..high-1 and their grid of prompts (what the memory budget reads too)."""
    chosen = select_templates(load_templates(), (cfg.operation,), (cfg.formation,))
    if not chosen:
        raise DataError(f"no {cfg.formation} template for {cfg.operation}; choose another formation")
    low, high = default_range(tokenizer, chosen[0], cfg.low, cfg.high)
    check_periods(cfg.periods, low, high)
    return low, high, number_grid(tokenizer, chosen[0], low, high, cfg.few_shot, cfg.max_pairs, cfg.seed)


def grid_width(grid: NumberGrid) -> int:
    """The widest of the grid's prompts followed by its answer, in tokens."""
    return max(len(p.ids) + len(p.answer) for p in grid.prompts)


def _analyze(handle: ModelHandle, cfg: NumbersConfig, out: Path, quiet: bool) -> NumbersResult:
    from tqdm.auto import tqdm

    view, dims, tokenizer = handle.view, handle.dims, handle.tokenizer
    layers = sorted(cfg.layers) if cfg.layers is not None else list(range(dims.n_layers))
    if max(layers) >= dims.n_layers:
        raise ConfigError(f"layer {max(layers)} does not exist: the model has layers 0..{dims.n_layers - 1}")
    low, high, grid = value_grid(tokenizer, cfg)
    run = read_identify_run(cfg.identify_run, handle) if cfg.identify_run is not None else None  # refused early
    start_time = time.perf_counter()
    check_fits_context(handle.model, grid_width(grid))
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    sites = [s for s in grid.sites if cfg.sites is None or s.name in cfg.sites]
    known = [*(s.name for s in grid.sites), CLOCK]
    clock_on = cfg.sites is None or CLOCK in cfg.sites
    if cfg.sites is not None and (bad := [s for s in cfg.sites if s not in known]):
        raise ConfigError(f"site {bad[0]!r} is not one of this tokenizer's: {', '.join(known)}")
    b_site = next(s for s in reversed(grid.sites) if s.token == "b")
    control = Site(f"{b_site.name}|a", "a", None, "b")
    all_sites = [*sites, control] if any(s.token == "a" for s in sites) else sites  # a's control, where a is read
    positions = {s.name: grid.prompts[0].positions[s.name] for s in grid.sites if s.token != "last"}
    positions[control.name] = positions[b_site.name]
    periods = tuple(cfg.periods or shown_periods(low, high))
    fams = select_families(families(low, high, grid.digit_split, periods), cfg.families)
    control_fams = [f for f in fams if f.kind in ("helix", "digit-circles", "pca")]
    control_fams = [f for f in control_fams if f.kind != "helix" or len(f.periods) == max(
        (len(g.periods) for g in control_fams if g.kind == "helix"), default=0)]  # fmt: skip
    check_pca_dim(cfg.pca_dim, [*(fams if sites else []), *(clock_families(periods) if clock_on else [])])
    cost = TokenLayers(dims.n_layers)

    correct, means, last = grid_means(view, grid, layers, all_sites, positions, pad, cfg.batch_size, cost,
                                      cfg.filter_correct, keep_last=clock_on)  # fmt: skip
    kept = correct.nonzero().flatten().tolist() if cfg.filter_correct else list(range(len(grid.prompts)))
    values = list(range(low, high))
    held = set(heldout_split(values, cfg.heldout, cfg.seed))
    train_mask = torch.tensor([v not in held for v in values])
    need = max(f.dim for f in fams) + 1
    rows: list[dict[str, Any]] = []
    fits_kept: dict[tuple[str, int, str, int], Fit] = {}
    site_counts: dict[str, Any] = {}
    patched: dict[str, list[PatchedPair]] = {}
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
        pairs = find_partners(view, tokenizer, grid, site, kept, cfg, pad, cost)
        if not pairs:
            raise DataError(f"site {site.name}: no correct prompt has a corrupted partner the model answers; "
                            "use --no-filter-correct or a wider range")  # fmt: skip
        site_fams = control_fams if site is control else fams
        fits = {layer: fit_families(means[site.name][:, li], low, high, site_fams, train_mask, pca_dim, cfg.seed,
                                    site.name, cfg.shuffles) for li, layer in enumerate(layers)}  # fmt: skip
        for layer in layers:  # the result keeps a shuffled control's subspace and W, not its prediction
            for (name, k), fit in fits[layer].items():
                fits_kept[(site.name, layer, name, k)] = replace(fit, pred=None) if k else fit
        unseen = fits[layers[0]][(site_fams[0].name, 0)].pred[:, 0].isnan()
        ld = patch_site(view, grid, site.name, positions.get(site.name), pairs, layers, site_fams, fits, cfg, pad,
                        cost, quiet, tqdm, value_indices(grid, site, unseen, seeded(cfg.seed, site.name)))  # fmt: skip
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
        rows += site_rows(site, site is control, layers, site_fams, fits, ld, is_held, cfg.min_effect)
    clock = _clock(handle, cfg, run, grid, layers, last, held, periods, pad, cost, quiet, tqdm) if clock_on else None
    elapsed = time.perf_counter() - start_time
    mean_len = sum(len(p.ids) + len(p.answer) for p in grid.prompts) / len(grid.prompts)
    unit = dims.n_layers * mean_len * len(grid.prompts)  # token-layers of one forward pass of the prompt set
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "template": grid.template.id,
        "range": {"low": low, "high": high, "digit_split": grid.digit_split, "periods": list(periods)},
        "layers": layers,
        "sites": [s.name for s in all_sites],
        "control_site": control.name if control in all_sites else None,
        "families": [f.name for f in fams],
        "values": {"train": [v for v in values if v not in held], "heldout": sorted(held)},
        "counts": {"grid_prompts": len(grid.prompts), "valid_pairs": grid.valid, "correct": int(correct.sum()),
                   "few_shot_examples": [list(e) for e in grid.examples], "sites": site_counts},  # fmt: skip
        "forward_pass_equivalents": {
            **{part: value / unit for part, value in cost.parts.items()},
            "total": sum(cost.parts.values()) / unit,
            "unit": "one forward pass of the grid's prompt set (with answers): n_layers x tokens",
        },
        "token_layers": dict(cost.parts),
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
            "clock": "numbers_clock.csv: the same columns at the last token, each row of the fits one correct prompt "
            "(a, b), held out when a is; families helix(a+b), helix(a,b), helix(a,b,a+b) (each operand's helix "
            "columns side by side) and PCA of helix(a,b,a+b)'s size; partners change a (so a + b changes); the "
            "patch of another value writes another prompt's prediction, one whose sum is neither the clean nor "
            "the corrupted one (analysis/clock_fits.py)",
            "clock_heads": "numbers_clock_heads.csv: c_ab, c_sum, c_joint the restored shares of the head's own "
            "effect (its output at the last token patched from the clean run) by the helix(a,b), helix(a+b) and "
            "helix(a,b,a+b) fits of its output (h + Q Q^T (f - h) in the head's output space, pushed through the "
            "rest of its layer); class a+b where c_sum >= 0.5 and beats c_ab by 0.2, a,b the other way round, "
            "mixed where c_joint >= 0.5 otherwise, else unexplained; classified on the held-out shares where "
            "estimable (classified_on); head_share: the slope of (head - corrupted) on (clean - corrupted)",
        },
        "timings": {"numbers_s": elapsed},
        "versions": package_versions(),
        "identify_runs": [clock.identify_run] if clock and clock.identify_run else [],
        "clock": clock.metadata if clock else None,
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    result = NumbersResult(rows, best_periods(rows), verdicts(rows), [s.name for s in all_sites], layers,
                           means, fits_kept, patched, out, metadata, clock)  # fmt: skip
    write_numbers_outputs(result, handle.source.get("model", "?"), grid)
    return result


def check_pca_dim(pca_dim: int | None, fams: list[Family]) -> None:
    """A stated PCA smaller than a family would cut that family's fit (and a PCA family) to fewer dimensions."""
    widest = max(fams, key=lambda f: f.dim, default=None)
    if pca_dim is not None and widest is not None and pca_dim < widest.dim:
        raise ConfigError(f"pca_dim {pca_dim} is below the {widest.dim} dimensions of {widest.name}, which it would "
                          f"cut; choose at least {widest.dim} or leave pca_dim unset")  # fmt: skip


def _clock(handle: ModelHandle, cfg: NumbersConfig, run: IdentifyRun | None, grid: NumberGrid, layers: list[int],
           last: LastToken, held: set[int], periods: tuple[int, ...], pad: int, cost: TokenLayers, quiet: bool,
           tqdm: Any) -> ClockResult:  # fmt: skip
    """Step 6: the Clock at the last token and, with an identify run, its heads classified."""
    table, counts, clock_rows, pairs = clock_site(handle.view, handle.tokenizer, grid, cfg, layers, last, held,
                                                  periods, pad, seeded(cfg.seed, CLOCK_SITE.name), cost, quiet,
                                                  tqdm)  # fmt: skip
    found = verdicts(table)
    heads: list[dict[str, Any]] = []
    record, metadata = None, {"counts": counts, "verdicts": [verdict_sentence(v) for v in found]}
    if run is not None:
        key = run.key.get("key_heads") or []
        chosen = (parse_components(",".join(key), handle.dims) if key else run.ranked("head")[: cfg.head_top_k])
        chosen = sorted(chosen, key=lambda c: (c.layer, c.head))
        heads = classify_heads(handle.view, grid, cfg, clock_rows, pairs, chosen, run.effects, periods, pad,
                               sum_indices(grid, clock_rows, seeded(cfg.seed, CLOCK_SITE.name, "heads")), cost, quiet,
                               tqdm)  # fmt: skip
        record = run.record
        metadata |= {"heads_source": "key_heads" if key else f"top {cfg.head_top_k} heads by effect",
                     "heads": [h.name for h in chosen], "head_order": order_sentence(heads)}  # fmt: skip
    return ClockResult(table, found, heads, metadata, record)
