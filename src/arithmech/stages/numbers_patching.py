"""The numbers stage's patching of one site: every variant of every family at every layer, as rows joining the
clean or corrupted run (step 3 of `stages/numbers.py`).

Per chunk of pairs, the clean and the corrupted prompts run once each (`patching/subspace.base_run`: the residual
entering every layer and the keys/values of every position). Every variant is then a row that joins one of those
runs at its layer at the site's position (`patching/subspace.patch_rows`), so the family x layer sweep costs the
rows' token-layers only, never a forward pass per variant:
    on the corrupted run  the whole layer (the clean residual); per family and each shuffled control k, its patch
                          h + Q Q^T (f(v) - h) of the clean value v and its patch of another value u (the chance
                          level its share is measured from)
    on the clean run      per family, its subspace set to the mean over values (ablation) and a random subspace of
                          the same rank set likewise
LD = logit[clean answer token] - logit[corrupted answer token] at the read position.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from arithmech.analysis.number_fits import Family, Fit, fit_patch, random_subspace, seeded
from arithmech.data.number_grid import NumberGrid, Partner, Site
from arithmech.errors import DataError
from arithmech.models.view import ModelView
from arithmech.patching.subspace import BaseRun, base_run, logit_diff, patch_rows, row_cost
from arithmech.stages.numbers_config import NumbersConfig
from arithmech.stages.numbers_grid import TokenLayers, pad_ids

Indices = Callable[[list[tuple[int, Partner]]], tuple[torch.Tensor, torch.Tensor]]
"""(all the pairs, once, before any pass) -> (clean, other) [pair] long: the row of each pair's clean value in
the fits' predictions, and the row of the other value its chance-level patch writes."""


def value_indices(grid: NumberGrid, site: Site, unseen: torch.Tensor, gen: torch.Generator) -> Indices:
    """`Indices` of a site that reads one operand's value: its value less low, and a seeded other value seen in
    the fits (`other_values`); unseen [value] bool marks the values without prompts."""

    def indices(chunk: list[tuple[int, Partner]]) -> tuple[torch.Tensor, torch.Tensor]:
        value = torch.tensor([(grid.prompts[i].a if site.operand == "a" else grid.prompts[i].b) - grid.low
                              for i, _ in chunk])  # fmt: skip
        corrupted = torch.tensor([p.value - grid.low for _, p in chunk])
        return value, other_values(value, corrupted, unseen, gen)

    return indices


def patch_site(view: ModelView, grid: NumberGrid, name: str, pos: int | None, pairs: list[tuple[int, Partner]],
               layers: list[int], fams: list[Family], fits: dict[int, dict[tuple[str, int], Fit]],
               cfg: NumbersConfig, pad: int, cost: TokenLayers, quiet: bool, tqdm: Any,
               indices: Indices) -> dict[str, torch.Tensor]:  # fmt: skip
    """LD of every variant of the module docstring at the site `name`: "clean", "corrupted" [pair]; "layer"
    [layer, pair]; ("fit" | "shuffled<k>" | "other-..." | "ablate" | "random", family) [layer, pair] keyed
    "kind:family"; and "other", "position" [pair] (long): the row of the patches of another value (`indices`)
    and the position patched (pos None: the last site, every prompt's query end)."""
    n = len(pairs)
    out: dict[str, torch.Tensor] = {"clean": torch.empty(n), "corrupted": torch.empty(n),
                                    "layer": torch.empty(len(layers), n), "other": torch.empty(n, dtype=torch.long),
                                    "position": torch.empty(n, dtype=torch.long)}  # fmt: skip
    for fam in fams:
        tags = ("fit", *(f"shuffled{k}" for k in range(1, cfg.shuffles + 1)))
        for kind in ("ablate", "random", *tags, *(f"other-{t}" for t in tags)):
            out[f"{kind}:{fam.name}"] = torch.full((len(layers), n), math.nan)
    # every draw before the passes, so that none depends on how the pairs are batched (--batch-size, --max-memory)
    values, others = indices(pairs)
    randoms = {(layer, fam.name): random_subspace(view.dims.d_model, fits[layer][(fam.name, 0)].rank,
                                                  seeded(cfg.seed, name, layer, fam.name))
               for layer in layers for fam in fams}  # fmt: skip
    with tqdm(total=n, desc=f"patch {name}", unit="prompt", disable=quiet) as bar:
        for part in pair_chunks(view, pairs, cfg.batch_size, pad, cost, "bases"):
            chunk, idx, mask, read, good, bad = part.pairs, part.idx, part.mask, part.read, part.good, part.bad
            clean, corr = part.clean, part.corr
            out["clean"][idx], out["corrupted"][idx] = part.ld_clean, part.ld_corr
            at = pos if pos is not None else query_end(grid, [i for i, _ in chunk])
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
                cost.add("rows", row_cost(view.dims.n_layers, layer_of, int(mask.shape[1]) - at))
                for v, (key, li, _) in enumerate(variants):
                    target_t = out[key]
                    target_t[li, idx] = ld[v * k : (v + 1) * k]
            bar.update(len(chunk))
            del part, clean, corr, base, on_corr, on_clean, variants  # freed before the next chunk's runs
    return out


@dataclass(frozen=True)
class PairChunk:
    """One batch of clean/corrupted pairs with both runs done: what every row patched on them starts from."""

    pairs: list[tuple[int, Partner]]
    idx: torch.Tensor  # [pair] their places in the whole list of pairs
    mask: torch.Tensor  # [pair, pos] of both (the partners have the clean prompt's length)
    read: torch.Tensor  # [pair] the position read
    good: torch.Tensor  # [pair] the clean answer's token there
    bad: torch.Tensor  # [pair] the corrupted answer's token there
    clean: BaseRun
    corr: BaseRun
    ld_clean: torch.Tensor  # [pair] LD of the clean run
    ld_corr: torch.Tensor  # [pair] LD of the corrupted run


def pair_chunks(view: ModelView, pairs: list[tuple[int, Partner]], batch_size: int, pad: int, cost: TokenLayers,
                part: str) -> Iterator[PairChunk]:  # fmt: skip
    """The pairs `batch_size` at a time, each batch's clean and corrupted prompts run once (`base_run`, counted
    as `part`)."""
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        clean_ids, mask = pad_ids([p.clean_ids for _, p in chunk], pad)
        corr_ids, _ = pad_ids([p.ids for _, p in chunk], pad)
        read = mask.sum(1) - 1
        good, bad = torch.tensor([p.good for _, p in chunk]), torch.tensor([p.bad for _, p in chunk])
        clean, clean_final = base_run(view, clean_ids, mask)
        corr, corr_final = base_run(view, corr_ids, mask)
        cost.forward(part, mask)
        cost.forward(part, mask)
        rows = torch.arange(len(chunk))
        yield PairChunk(chunk, torch.arange(start, start + len(chunk)), mask, read, good, bad, clean, corr,
                        logit_diff(view, clean_final[rows, read], good, bad).float().cpu(),
                        logit_diff(view, corr_final[rows, read], good, bad).float().cpu())  # fmt: skip
        del clean, corr, clean_final, corr_final  # before the next chunk's runs (the caller drops its own too)


def query_end(grid: NumberGrid, prompts: list[int]) -> int:
    """The position of the prompts' last query token (the last site), which must be the same for all."""
    at_each = {len(grid.prompts[i].ids) - 1 for i in prompts}
    if len(at_each) > 1:
        raise DataError("the prompts' last tokens fall at different positions; use one template")
    return next(iter(at_each))


def other_values(value: torch.Tensor, corrupted: torch.Tensor, unseen: torch.Tensor,
                 gen: torch.Generator) -> torch.Tensor:  # fmt: skip
    """[prompt] for each prompt a seeded value (an index, as `value`) other than its clean and corrupted ones
    among the seen values: the wrong value the fit's baseline patch writes."""
    pool = (~unseen).nonzero().flatten()
    out = []
    for v, c in zip(value.tolist(), corrupted.tolist(), strict=True):
        allowed = pool[(pool != v) & (pool != c)]
        out.append(int(allowed[int(torch.randint(len(allowed), (1,), generator=gen))]) if len(allowed) else v)
    return torch.tensor(out)
