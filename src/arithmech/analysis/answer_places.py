"""Per-digit path patching: effects per (component, answer place), split by carry, and how the places' top
components overlap.

Background
    A digit-splitting tokenizer writes 27 + 15 = 42 as two tokens, "4" then "2". Scored with teacher forcing
    (`data/tokens.py`, answer_digits), an answer's j-th token is scored on the prompts followed by its first
    j - 1 tokens, so the same scan gives one effect per component and scored token. Tokens are grouped by place
    value from the units (`data/places.py`: units, tens, hundreds), not by their index in the answer: with
    answers of one and two digits in one run, the first token is the tens of one and the units of the other.
    Which components write the tens digit and which the units digit, and whether they change with a carry
    (`data/carries.py`), is then read from these tables.

Formulas (per_prompt: the scan's relative change [component, row], METHODS.md sec. 2)
    effect(c, q, g)     = mean over the rows whose scored token is at place q and whose pair is in group g (all,
                          carry, no carry, borrow, no borrow) of per_prompt[c, row]; effect_std their sample
                          standard deviation (empty for one row: undefined); groups with no row are left out.
    overlap(q, r, k)    = top_k_overlap(effect(., q, all), effect(., r, all), k) (`analysis/agreement.py`), with
                          the Spearman correlation of the two effect vectors.

Usage
    >>> rows = place_effects(patch, tokenized)        # effects_by_place.csv
    >>> place_overlap(patch, tokenized, ks=(5, 10))   # place_overlap.csv
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from arithmech.analysis.agreement import spearman, top_k_overlap
from arithmech.data.carries import carry_group, place_group_masks
from arithmech.data.places import place_name
from arithmech.data.tokens import TokenizedPairs
from arithmech.patching.path import PatchResult
from arithmech.runs import cell

PLACE_COLUMNS = ("component", "layer", "head", "kind", "place", "group", "prompts", "effect", "effect_std")
"""effects_by_place.csv; place is "units", "tens", "hundreds", ... (`data/places.place_name`)."""


def place_masks(tokenized: TokenizedPairs) -> dict[tuple[int, str], torch.Tensor]:
    """(place, group) -> [row] bool of the scan's rows (`data/carries.place_group_masks`)."""
    return place_group_masks(tokenized.answer_place, [carry_group(pair) for pair in tokenized.pairs])


def place_effect_table(patch: PatchResult, tokenized: TokenizedPairs) -> dict[tuple[int, str], torch.Tensor]:
    """(place, group) -> [component] mean effect over its rows."""
    return {key: patch.per_prompt[:, mask].mean(1) for key, mask in place_masks(tokenized).items()}


def place_effects(patch: PatchResult, tokenized: TokenizedPairs) -> list[dict[str, object]]:
    """The rows of effects_by_place.csv (PLACE_COLUMNS), from the units up, group "all" first."""
    rows: list[dict[str, object]] = []
    for (place, group), mask in place_masks(tokenized).items():
        values = patch.per_prompt[:, mask]
        mean = values.mean(1)
        std = values.std(1).tolist() if values.shape[1] > 1 else [None] * len(patch.components)
        for component, effect, spread in zip(patch.components, mean.tolist(), std, strict=True):
            rows.append({
                "component": component.name,
                "layer": component.layer,
                "head": "" if component.head is None else component.head,
                "kind": component.kind,
                "place": place_name(place),
                "group": group,
                "prompts": int(mask.sum()),
                "effect": cell(effect, ".8g"),
                "effect_std": cell(spread, ".8g"),
            })  # fmt: skip
    return rows


def place_overlap(
    patch: PatchResult, tokenized: TokenizedPairs, ks: Sequence[int] = (5, 10, 20)
) -> list[dict[str, object]]:
    """One row per pair of answer places (lower place first): place_a, place_b, spearman, top{k}_overlap for each
    k up to the number of components (group "all")."""
    table = place_effect_table(patch, tokenized)
    places = sorted(p for p, g in table if g == "all")
    rows: list[dict[str, object]] = []
    for i, a in enumerate(places):
        for b in places[i + 1 :]:
            x, y = table[(a, "all")], table[(b, "all")]
            rho = spearman(x, y)  # nan when one place's effects are constant: an empty cell
            shown = cell(None if math.isnan(rho) else rho, ".6f")
            row: dict[str, object] = {"place_a": place_name(a), "place_b": place_name(b), "spearman": shown}
            for k in ks:
                if k <= len(x):
                    row[f"top{k}_overlap"] = cell(top_k_overlap(x, y, k), ".4f")
            rows.append(row)
    return rows
