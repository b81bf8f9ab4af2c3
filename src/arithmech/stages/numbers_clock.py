"""The numbers stage's Clock at the last token (issue 35, item 5): helix(a, b, a+b) against helix(a+b), helix(a, b)
and a PCA of equal size, fitted to each correct prompt's last-token residual and judged by the same patching.

Background and families: `analysis/clock_fits.py`. The rows of the fits are the correct prompts (a, b) of the
grid, not a value's mean; a prompt is held out when its a is a held-out value (the stage's 80/20 split). The site
"clock" patches the last token, its corrupted partner changing a (`data/number_grid.partner` at the last token),
so that a + b changes with it; each fit's chance level is its patch of another prompt's prediction, one whose
sum differs from both the clean and the corrupted sum. The patching, table and verdict are the numbers stage's
own (`numbers_patching.patch_site`, `numbers_table.site_rows`, `numbers_verdict.verdicts`): numbers_clock.csv
has numbers_ld.csv's columns, its variable "a,b".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from arithmech.analysis.clock_fits import clock_basis, clock_families
from arithmech.analysis.number_fits import Family, Fit, fit_rows
from arithmech.data.number_grid import NumberGrid, Partner, Site
from arithmech.errors import ConfigError
from arithmech.models.view import ModelView
from arithmech.stages.numbers_config import CLOCK, NumbersConfig
from arithmech.stages.numbers_grid import LastToken, TokenLayers, find_partners
from arithmech.stages.numbers_patching import Indices, patch_site
from arithmech.stages.numbers_table import site_rows

CLOCK_SITE = Site(CLOCK, "a", None, "last")
"""The last token, its partner changing a; named apart from "last" (which fits a's value alone there)."""


@dataclass
class ClockRows:
    """The fitted rows of the Clock: which prompts, their operands and which are held out."""

    prompts: list[int]  # grid prompt index of each row
    a: torch.Tensor  # [row] long
    b: torch.Tensor  # [row] long
    held: torch.Tensor  # [row] bool: a is a held-out value

    def basis(self, family: Family) -> torch.Tensor | None:
        """[row, m] the family's basis (None for PCA)."""
        return None if family.kind == "pca" else clock_basis(family, self.a, self.b)


def clock_rows(grid: NumberGrid, last: LastToken, held: set[int]) -> ClockRows:
    """The rows of the prompts whose last-token residual the grid pass kept."""
    prompts = sorted(last)
    a = torch.tensor([grid.prompts[i].a for i in prompts])
    b = torch.tensor([grid.prompts[i].b for i in prompts])
    return ClockRows(prompts, a, b, torch.tensor([int(x) in held for x in a.tolist()], dtype=torch.bool))


def clock_fits(rows: ClockRows, last: LastToken, layers: list[int], periods: tuple[int, ...], cfg: NumbersConfig,
               pca_dim: int | None) -> tuple[list[Family], dict[int, dict[tuple[str, int], Fit]]]:  # fmt: skip
    """The Clock's families and, per layer, their fits and shuffled controls (`number_fits.fit_rows`)."""
    fams = clock_families(periods)
    train = ~rows.held
    need = max(f.dim for f in fams) + 1
    if int(train.sum()) < need:
        raise ConfigError(
            f"the Clock has only {int(train.sum())} correct prompts with a train value of a to fit on, fewer than "
            f"the {need} helix(a, b, a+b) needs; raise max_pairs, widen the range or leave the clock site out"
        )
    acts = torch.stack([last[i] for i in rows.prompts])  # [row, layer, d_model]
    dim = pca_dim if pca_dim is not None else int(train.sum()) - 1
    if dim > int(train.sum()):
        raise ConfigError(f"pca_dim {dim} is above the {int(train.sum())} prompts the Clock fits on; choose "
                          f"{int(train.sum())} or less, or raise max_pairs")  # fmt: skip
    bases = {f.name: rows.basis(f) for f in fams}
    fits = {layer: fit_rows(acts[:, li].double(), bases, fams, train, dim, cfg.seed, CLOCK_SITE.name, cfg.shuffles)
            for li, layer in enumerate(layers)}  # fmt: skip
    return fams, fits


def sum_indices(grid: NumberGrid, rows: ClockRows, gen: torch.Generator) -> Indices:
    """`Indices` of the Clock: each pair's clean prompt's row, and a seeded other row whose sum is neither the
    clean nor the corrupted one (the chance level of a reading of a + b)."""
    row_of = {p: r for r, p in enumerate(rows.prompts)}
    sums = rows.a + rows.b  # [row]

    def indices(chunk: list[tuple[int, Partner]]) -> tuple[torch.Tensor, torch.Tensor]:
        clean = torch.tensor([row_of[i] for i, _ in chunk])
        other = []
        for (i, p), r in zip(chunk, clean.tolist(), strict=True):
            bad = {int(sums[r]), p.value + grid.prompts[i].b}
            allowed = torch.tensor([s not in bad for s in sums.tolist()]).nonzero().flatten()
            other.append(int(allowed[int(torch.randint(len(allowed), (1,), generator=gen))]) if len(allowed) else r)
        return clean, torch.tensor(other)

    return indices


def clock_site(view: ModelView, tokenizer: Any, grid: NumberGrid, cfg: NumbersConfig, layers: list[int],
               last: LastToken, held: set[int], periods: tuple[int, ...], pad: int, gen: torch.Generator,
               cost: TokenLayers, quiet: bool, tqdm: Any) -> tuple[list[dict[str, Any]], dict[str, Any], ClockRows,
                                                                 list[tuple[int, Partner]]]:  # fmt: skip
    """(numbers_clock.csv's rows, the counts for metadata.json, the fitted rows, the pairs patched)."""
    rows = clock_rows(grid, last, held)
    fams, fits = clock_fits(rows, last, layers, periods, cfg, cfg.pca_dim)
    pairs = find_partners(view, tokenizer, grid, CLOCK_SITE, rows.prompts, cfg, pad, cost)
    if not pairs:
        raise ConfigError("the clock site has no correct prompt whose corrupted partner the model answers; use "
                          "--no-filter-correct, a wider range, or leave the clock site out")  # fmt: skip
    ld = patch_site(view, grid, CLOCK_SITE.name, None, pairs, layers, fams, fits, cfg, pad, cost, quiet, tqdm,
                    sum_indices(grid, rows, gen))  # fmt: skip
    is_held = torch.tensor([grid.prompts[i].a in held for i, _ in pairs], dtype=torch.bool)
    table = [{**r, "variable": "a,b"} for r in site_rows(CLOCK_SITE, False, layers, fams, fits, ld, is_held,
                                                          cfg.min_effect)]  # fmt: skip
    counts = {"rows": len(rows.prompts), "train_rows": int((~rows.held).sum()), "pairs": len(pairs),
              "heldout_pairs": int(is_held.sum()), "families": [f.name for f in fams]}  # fmt: skip
    return table, counts, rows, pairs
