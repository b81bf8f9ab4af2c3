"""The restored share: how much of a whole-activation patch's effect on the logit difference a partial patch
gives back, and when that ratio means nothing (Kantamneni & Tegmark 2025, sec. 4.2; issue 35).

Background
    A reading of an activation (a fit of the numbers, a helix of a head's output) is judged by patching it into
    a corrupted run and reading LD = logit[clean answer] - logit[corrupted answer]. The whole activation
    patched from the clean run sets the scale; a reading's share of it is 1 when its patch does all the whole
    patch does and 0 at chance. Chance is the same reading's patch of another value: it erases the corrupted
    value in the reading's subspace just as the reading's own patch does, so measuring from it credits no
    reading for erasing alone.

Formula, over the pairs i in `which` (each a tensor [pair])
    x_i = whole_i - corr_i                           the whole patch's per-pair effect
    share(value, base) = sum_i (value_i - base_i) x_i / sum_i x_i^2     (x from base unless corr is given)
    restored(value, base) = share(value, base; x from corr) / share(whole, base; x from corr)
                          = sum_i (value_i - base_i) x_i / sum_i (whole_i - base_i) x_i
    Not estimable (None, with a reason) where clean and corrupted barely differ (RMS under `MIN_LOGITS`), where
    the whole patch moves LD by under `min_effect` of that, or where the base already gives nearly all of the
    whole patch's effect.

Usage
    >>> restored_share(fit_ld, other_ld, layer_ld, train, clean_ld, corr_ld, min_effect=0.1)   # float | None

References: Kantamneni & Tegmark, ICML 2025 (arXiv 2502.00873) sec. 4.2 (LD restored against the whole layer).
"""

from __future__ import annotations

import torch

MIN_LOGITS = 1e-3
"""Clean and corrupted runs closer than this (RMS over pairs, in logits) leave nothing to restore."""


def _rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt()) if x.numel() else 0.0


def share(value: torch.Tensor, base: torch.Tensor, whole: torch.Tensor, which: torch.Tensor,
          corr: torch.Tensor | None = None) -> float | None:  # fmt: skip
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


def not_estimable(clean: torch.Tensor, corr: torch.Tensor, whole: torch.Tensor, base: torch.Tensor,
                  which: torch.Tensor, min_effect: float, what: str = "layer") -> str | None:  # fmt: skip
    """Why a restored share over the pairs `which` would mean nothing, or None. The clean and corrupted runs
    must differ (RMS over pairs at least `MIN_LOGITS`), the whole patch must move LD by at least `min_effect` of
    that (RMS of whole - corrupted over pairs), and, for a reading (base: its patch of another value), the whole
    patch must beat base along its own effect by `min_effect` (`restored_share`'s denominator); else a ratio
    such as 4.5 is noise over a near-zero effect."""
    if not bool(which.any()):
        return "no pairs"
    total = _rms((clean - corr)[which])
    if total < MIN_LOGITS:
        return f"clean and corrupted LD differ by {total:.2g} logits (RMS over pairs), under {MIN_LOGITS:g}"
    effect = _rms((whole - corr)[which])
    if effect < min_effect * total:
        return (f"the whole-{what} patch moves LD by {effect:.2g} (RMS over pairs), under min_effect {min_effect:g} "
                f"of the clean-corrupted difference {total:.2g}")
    if base is not corr and (gain := share(whole, base, whole, which, corr)) is not None and gain < min_effect:
        return (f"the fit's patch of another value already gives {1 - gain:.0%} of the whole {what}'s effect, "
                f"leaving under min_effect {min_effect:g} to restore")
    return None


def restored_share(value: torch.Tensor, base: torch.Tensor, whole: torch.Tensor, which: torch.Tensor,
                   clean: torch.Tensor, corr: torch.Tensor, min_effect: float) -> float | None:  # fmt: skip
    """share(value) / share(whole), both from `base` (the reading's patch of another value) and along the whole
    patch's per-pair effect x = whole - corr: sum_i (value_i - base_i) x_i / sum_i (whole_i - base_i) x_i over
    the pairs `which`; None where `not_estimable`. 1 for a reading whose patch is the clean activation, 0 in
    expectation for one whose patch of the clean value is no better than of another (a wrong-order fit): its two
    patches are exchangeable, and x shares no term with them. Measured from the corrupted run instead, any patch
    that erases the corrupted value in its subspace would score about one half."""
    if bool(value[which].isnan().any()) or not_estimable(clean, corr, whole, base, which, min_effect):
        return None
    top, bottom = share(value, base, whole, which, corr), share(whole, base, whole, which, corr)
    return None if top is None or bottom is None else top / bottom
