"""numbers_ld.csv: one row per site, layer and family (the whole layer first), its LDs turned into shares.

A row holds the mean LDs of its variants over the pairs whose clean value is a train value (columns `*_heldout`:
a held-out value), the restored shares of `analysis/restored_share.py` (each fit measured from its own patch of
another value, each shuffled control from its own), the ablation's lost share (the same slope of clean - ablated
on clean - corrupted) and, where the whole-layer effect is too small, `estimable` 0 with the reason and the
shares left empty. The Explain guide's table names every column (a test holds it to `COLUMNS`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from arithmech.analysis.number_fits import Family, Fit
from arithmech.analysis.restored_share import not_estimable, restored_share, share
from arithmech.data.number_grid import Site

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


def site_rows(site: Site, is_control: bool, layers: list[int], fams: list[Family],
              fits: dict[int, dict[tuple[str, int], Fit]], ld: dict[str, torch.Tensor],
              held: torch.Tensor, min_effect: float) -> list[dict[str, Any]]:  # fmt: skip
    """numbers_ld.csv rows of one site from its LDs (`numbers_patching.patch_site`): the whole layer, then each
    family, per layer; held [pair] marks the pairs whose clean value is held out."""
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


def shuffles_of(fits: dict[tuple[str, int], Fit], fam: Family) -> list[Fit]:
    """The shuffled controls of a family at one layer, in order."""
    return [fit for (name, k), fit in sorted(fits.items(), key=lambda kv: kv[0][1]) if name == fam.name and k > 0]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _mean_of(values: list[float | None]) -> float | None:
    kept = [x for x in values if x is not None]
    return sum(kept) / len(kept) if kept and len(kept) == len(values) else None
