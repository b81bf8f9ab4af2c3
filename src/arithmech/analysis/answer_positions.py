"""Per-digit path patching: effects per (component, answer position), split by carry, and how the positions'
top components overlap.

Background
    A digit-splitting tokenizer writes 27 + 15 = 42 as two tokens, "4" then "2". Scored with teacher forcing
    (`data/tokens.py`, answer_digits), position j's rows are the prompts followed by the answer's first j - 1
    tokens, patched and scored on token j, so the same scan gives one effect per component and position. Which
    components write the tens digit and which the units digit, and whether they change with a carry
    (`data/carries.py`), is then read from these tables.

Formulas (per_prompt: the scan's relative change [component, row], METHODS.md sec. 2)
    effect(c, j, g)     = mean over the rows at position j whose pair is in group g (all, carry, no carry,
                          borrow, no borrow) of per_prompt[c, row]; effect_std their sample standard deviation
                          (empty for one row: undefined); groups with no row are left out.
    overlap(i, j, k)    = top_k_overlap(effect(., i, all), effect(., j, all), k) (`analysis/agreement.py`), with
                          the Spearman correlation of the two effect vectors.

Usage
    >>> rows = position_effects(patch, tokenized)        # effects_by_position.csv
    >>> position_overlap(patch, tokenized, ks=(5, 10))   # position_overlap.csv
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from arithmech.analysis.agreement import spearman, top_k_overlap
from arithmech.data.carries import carry_group, position_group_masks
from arithmech.data.tokens import TokenizedPairs
from arithmech.patching.path import PatchResult
from arithmech.runs import cell

POSITION_COLUMNS = ("component", "layer", "head", "kind", "position", "group", "prompts", "effect", "effect_std")


def position_masks(tokenized: TokenizedPairs) -> dict[tuple[int, str], torch.Tensor]:
    """(position, group) -> [row] bool of the scan's rows (`data/carries.position_group_masks`)."""
    return position_group_masks(tokenized.answer_position, [carry_group(pair) for pair in tokenized.pairs])


def position_effect_table(patch: PatchResult, tokenized: TokenizedPairs) -> dict[tuple[int, str], torch.Tensor]:
    """(position, group) -> [component] mean effect over its rows."""
    return {key: patch.per_prompt[:, mask].mean(1) for key, mask in position_masks(tokenized).items()}


def position_effects(patch: PatchResult, tokenized: TokenizedPairs) -> list[dict[str, object]]:
    """The rows of effects_by_position.csv (POSITION_COLUMNS), position by position, group "all" first."""
    rows: list[dict[str, object]] = []
    for (position, group), mask in position_masks(tokenized).items():
        values = patch.per_prompt[:, mask]
        mean = values.mean(1)
        std = values.std(1).tolist() if values.shape[1] > 1 else [None] * len(patch.components)
        for component, effect, spread in zip(patch.components, mean.tolist(), std, strict=True):
            rows.append({
                "component": component.name,
                "layer": component.layer,
                "head": "" if component.head is None else component.head,
                "kind": component.kind,
                "position": position,
                "group": group,
                "prompts": int(mask.sum()),
                "effect": cell(effect, ".8g"),
                "effect_std": cell(spread, ".8g"),
            })  # fmt: skip
    return rows


def position_overlap(
    patch: PatchResult, tokenized: TokenizedPairs, ks: Sequence[int] = (5, 10, 20)
) -> list[dict[str, object]]:
    """One row per pair of answer positions: position_a, position_b, spearman, top{k}_overlap for each k up to
    the number of components (group "all")."""
    table = position_effect_table(patch, tokenized)
    positions = sorted(p for p, g in table if g == "all")
    rows: list[dict[str, object]] = []
    for i, a in enumerate(positions):
        for b in positions[i + 1 :]:
            x, y = table[(a, "all")], table[(b, "all")]
            rho = spearman(x, y)  # nan when one position's effects are constant: an empty cell
            shown = cell(None if math.isnan(rho) else rho, ".6f")
            row: dict[str, object] = {"position_a": a, "position_b": b, "spearman": shown}
            for k in ks:
                if k <= len(x):
                    row[f"top{k}_overlap"] = cell(top_k_overlap(x, y, k), ".4f")
            rows.append(row)
    return rows
