"""Whether a problem carries (addition) or borrows (subtraction), so per-digit effects can be split by it.

Background
    A digit of a sum depends on the digits below it only through the carry: 27 + 15 needs the units' carry
    for its tens digit, 21 + 15 does not. Circuits that write the digits may differ between the two cases, so
    the per-digit scans (`analysis/answer_places.py`) report them apart.

Rule, on the written operands a and b (whole numbers >= 0), column by column from the units:
    addition     "carry" if some column has digit(a) + digit(b) + carry-in >= 10, else "no carry";
    subtraction  "borrow" if some column has digit(a) - borrow-in < digit(b) (a >= b), else "no borrow";
    None for other operations, or operands that are not whole numbers (a user's prompts without a and b).

Cells (`place_group_masks`)
    The per-digit tables (identify's effects, knockout's accuracies) report every (answer place, group) with a
    row: for each place from the units up (`places.py`), group "all" first, then each carry group present, sorted.

Usage
    >>> carry_group(pair)   # "carry" for 27 + 15, "no carry" for 21 + 15
    >>> place_group_masks(t.answer_place, [carry_group(p) for p in t.pairs])  # {(0, "all"): mask, ...}
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from arithmech.data.prompts import PromptPair


def carry_group(pair: PromptPair) -> str | None:
    """The pair's group by the rule of the module docstring."""
    if pair.a is None or pair.b is None or not (pair.a.isdigit() and pair.b.isdigit()):
        return None
    a, b = int(pair.a), int(pair.b)
    if pair.operation == "addition":
        return "carry" if _carries(a, b) else "no carry"
    if pair.operation == "subtraction" and a >= b:
        return "borrow" if _borrows(a, b) else "no borrow"
    return None


def place_group_masks(place: torch.Tensor, groups: Sequence[str | None]) -> dict[tuple[int, str], torch.Tensor]:
    """(place, group) -> [row] bool for rows at `place` [row] whose group (`groups` [row]) matches, in the
    order of the module docstring; cells without a row are left out."""
    names = sorted({g for g in groups if g is not None})
    masks = {}
    for p in sorted(set(place.tolist())):
        at = place == p
        masks[(int(p), "all")] = at
        for name in names:
            mask = at & torch.tensor([g == name for g in groups], dtype=torch.bool)
            if bool(mask.any()):
                masks[(int(p), name)] = mask
    return masks


def _carries(a: int, b: int) -> bool:
    """Some column carries: up to the first one, no column has a carry-in, so digit(a) + digit(b) >= 10."""
    while a or b:
        if a % 10 + b % 10 >= 10:
            return True
        a, b = a // 10, b // 10
    return False


def _borrows(a: int, b: int) -> bool:
    """Some column borrows: up to the first one, no column has a borrow-in, so digit(a) < digit(b)."""
    while b:
        if a % 10 < b % 10:
            return True
        a, b = a // 10, b // 10
    return False
