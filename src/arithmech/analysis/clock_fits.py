"""The Clock (Kantamneni & Tegmark 2025, sec. 5): helices of a, b and a + b fitted to what the model holds at the
last token, and the rule that names a head by the helix that explains its effect.

Background
    Kantamneni & Tegmark propose that a model adds on a helix: the helices of a and b, moved to the last token,
    are combined into the helix of a + b, which is read out to the logits (the "Clock", after Nanda et al.'s
    modular-addition circuit). They fit the last token's activations with helix(a, b, a+b) against helix(a+b)
    and a PCA of the same size, judged by the logit difference each restores when patched; and they label the
    key attention heads by the share of each head's effect that the helix(a, b) fit and the helix(a+b) fit
    explain (c_{a,b} and c_{a+b}), finding that heads of earlier layers move a and b while later ones write
    a + b. The paper's text was not at hand to quote the exact formula of c; this module's is stated below,
    measured by the same causal patching as every other reading of the numbers stage.

Families, per operand set S (one column block per operand, each the helix basis of `number_fits.basis`)
    helix(S)  [row, |S| (1 + circle_dim(T))]: [B_T(x) for x in S], B_T(x) = [x, cos(2 pi x / t), sin(2 pi x / t)
              for t in T] (period 2: cos only), S one of (a+b), (a, b), (a, b, a+b);
    pca-m     the equal-size baseline of each helix: m = its dimension.
    A row is one prompt (a, b), not a value's mean: a + b is not a function of either operand alone. Each is
    fitted as `number_fits.fit_basis` fits a family (PCA of the activations, least squares from the basis,
    leave-one-out prediction of every train row, the shuffled control permuting the basis over the train rows).

Head classes (`head_class`), from the restored shares of a head's own effect (`analysis/restored_share.py`,
the whole head's output patched as the "whole"), each fit's patch being the head's output h + Q Q^T (f(a, b) - h)
    c_ab = the share restored by the helix(a, b) fit,  c_sum = by the helix(a+b) fit,  c_joint = by
    helix(a, b, a+b);
    "a+b"         c_sum >= `HEAD_EXPLAINED` and c_sum - c_ab >= `HEAD_MARGIN`;
    "a,b"         c_ab >= `HEAD_EXPLAINED` and c_ab - c_sum >= `HEAD_MARGIN`;
    "mixed"       c_joint >= `HEAD_EXPLAINED`, neither of the above (both helices carry it, or they tie);
    "unexplained" otherwise, or where the head's effect is too small to share out (not estimable).
    The linear term of helix(a+b) is a + b, which helix(a, b) holds too: a head that writes only the line of the
    sum explains as well by either, and is "mixed"; the circles of a + b are what helix(a, b) cannot write.

Usage
    >>> fams = clock_families((2, 5, 10))
    >>> b = clock_basis(fams[0], a, b_)        # [prompt, m] for operands a, b_ [prompt]
    >>> head_class(c_ab=0.1, c_sum=0.9, c_joint=0.95)   # "a+b"

References: Kantamneni & Tegmark, ICML 2025 (arXiv 2502.00873) sec. 5 (the Clock, helix(a, b, a+b) at the last
token, c_{a,b} and c_{a+b} of the attention heads); Nanda et al. 2023 (the Clock in modular addition).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from arithmech.analysis.number_fits import Family, basis, circle_dim

CLOCK_OPERANDS: tuple[tuple[str, ...], ...] = (("a+b",), ("a", "b"), ("a", "b", "a+b"))
"""The operand sets fitted, smallest first (so an exact tie goes to the fewer columns)."""
HEAD_EXPLAINED = 0.5
"""A helix explains a head when its patch restores at least this share of the head's own effect."""
HEAD_MARGIN = 0.2
"""... and a head is an a,b or an a+b head when that helix's share beats the other's by this much."""
HEAD_CLASSES = ("a,b", "a+b", "mixed", "unexplained")


def clock_families(periods: Sequence[int]) -> list[Family]:
    """helix(a+b), helix(a, b), helix(a, b, a+b) over `periods`, then a PCA of each one's size."""
    one = 1 + circle_dim(periods)
    out = [Family("helix", tuple(periods), one * len(ops), ops) for ops in CLOCK_OPERANDS]
    return [*out, *(Family("pca", (), m) for m in sorted({f.dim for f in out}))]


def operand_values(family: Family, a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
    """The values [prompt] of each of the family's operands."""
    known = {"a": a, "b": b, "a+b": a + b}
    return [known[op] for op in family.operands]


def clock_basis(family: Family, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[prompt, m] (float64): the helix basis of every operand of the family side by side, a and b [prompt]."""
    one = Family(family.kind, family.periods, 1 + circle_dim(family.periods))
    blocks = [basis(one, v, 0, int(v.max()) + 1) for v in operand_values(family, a, b)]  # [prompt, 1 + ...] each
    return torch.cat(blocks, dim=1)  # [prompt, m]


def head_class(c_ab: float | None, c_sum: float | None, c_joint: float | None) -> str:
    """The class of the module docstring from the three shares (None: not estimable)."""
    ab, total, joint = (x if x is not None else float("-inf") for x in (c_ab, c_sum, c_joint))
    if total >= HEAD_EXPLAINED and total - ab >= HEAD_MARGIN:
        return "a+b"
    if ab >= HEAD_EXPLAINED and ab - total >= HEAD_MARGIN:
        return "a,b"
    if joint >= HEAD_EXPLAINED:
        return "mixed"
    return "unexplained"
