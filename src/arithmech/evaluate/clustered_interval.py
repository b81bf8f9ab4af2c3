"""Confidence intervals for accuracies measured on templates crossed with problems, not on independent prompts.

Background
    The arithmetic test part asks every held-out template on every held-out problem (subtraction: 6 templates x
    20 problems = 120 prompts). Two prompts of one template share its phrasing, two of one problem share its
    numbers, so their outcomes are correlated and the 120 are worth fewer independent draws; the Wilson interval
    on n = 120 is then too narrow. Problems are clustered by their fact (data/facts.py), so 3 + 5 and
    5 + 3, or 7 - 2 and 7 - 5, count as one unit.

Method: two-way cluster-robust variance of a mean (Cameron, Gelbach & Miller 2011), y_i per prompt, e_i = y_i - mean:

        V_g     = G_g / (G_g - 1) * sum_{c in g} (sum_{i in c} e_i)^2 / n^2      for g = template, fact (G_g clusters)
        V_cell  = n / (n - 1) * sum_i e_i^2 / n^2                                  (each prompt its own cluster)
        V       = max(V_template + V_fact - V_cell, p (1 - p) / n)                 (never below independent draws)

    A factor with one cluster adds nothing (its residuals sum to 0): the interval is then conditional on that
    template or problem. The G / (G - 1) factors are the usual small-sample correction; with 6 templates the
    variance is still somewhat underestimated, so the intervals are, if anything, still a little narrow.
    - Proportions (`clustered_wilson`): the Wilson interval (evaluate/arithmetic.py) on the effective number of
      independent prompts n_eff = p (1 - p) / V, with k = p n_eff. It stays in [0, 1] and is not degenerate at
      0% or 100%; there the residuals are all 0 and V cannot be estimated, so n_eff is the smallest number of
      clusters of a factor with more than one (as if the outcome were constant within each of them).
    - Differences (`clustered_difference`): a paired per-prompt difference d_i of two models on the same prompts,
      mean(d) +- z sqrt(V + extra), where `extra` adds variance that the prompts do not show (seed to seed). Where
      every d_i is the same (two models right on the same prompts), V is 0 but not known to be: the half-width is
      then the Wilson upper bound of 0 discordant prompts in n_eff (the fallback above), so 0 of 6 prompts apart
      is not read as a difference known to be exactly 0.

Why not a bootstrap over templates and problems: the pigeonhole bootstrap is deterministic only with a fixed RNG
stream, gives [0, 0] at 0% correct, and with 6 templates draws from only 462 distinct template multisets; this
closed form is reproducible to the last digit, handles the incomplete crossing of a `--limit` subset, and reduces
to (at most a few percent above) the plain Wilson interval when outcomes are independent (tested).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

Z_95 = 1.959963984540054


def wilson_interval(k: float, n: float, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (NaN, NaN for n = 0); k and n may be effective counts."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _cluster_term(residuals: Sequence[float], labels: Sequence[Hashable]) -> tuple[float, int]:
    """sum over clusters of (sum of residuals)^2, and the number of clusters."""
    sums: dict[Hashable, float] = {}
    for e, label in zip(residuals, labels, strict=True):
        sums[label] = sums.get(label, 0.0) + e
    return sum(s * s for s in sums.values()), len(sums)


def two_way_variance(values: Sequence[float], templates: Sequence[Hashable], facts: Sequence[Hashable]) -> float:
    """The variance of mean(values) with prompts clustered by template and by fact (module docstring), before the
    floor at independent draws."""
    n = len(values)
    mean = sum(values) / n
    e = [v - mean for v in values]
    total = 0.0
    for labels in (templates, facts):
        square, g = _cluster_term(e, labels)
        total += g / (g - 1) * square / n**2 if g > 1 else 0.0
    cell = sum(x * x for x in e) / n**2 * (n / (n - 1) if n > 1 else 1.0)
    return total - cell


def _fewest_clusters(templates: Sequence[Hashable], facts: Sequence[Hashable]) -> float:
    """n_eff where the outcomes do not vary: the fewest clusters of a factor with more than one (else n)."""
    counts = [len(set(labels)) for labels in (templates, facts)]
    return float(min([c for c in counts if c > 1], default=len(templates)))


def effective_n(outcomes: Sequence[bool], templates: Sequence[Hashable], facts: Sequence[Hashable]) -> float:
    """How many independent prompts the clustered outcomes are worth for their mean (1 <= n_eff <= n)."""
    n = len(outcomes)
    if n == 0:
        return 0.0
    p = sum(outcomes) / n
    if p in (0.0, 1.0):
        return _fewest_clusters(templates, facts)
    variance = max(two_way_variance([float(o) for o in outcomes], templates, facts), p * (1 - p) / n)
    return max(1.0, min(float(n), p * (1 - p) / variance))


def clustered_wilson(
    outcomes: Sequence[bool], templates: Sequence[Hashable], facts: Sequence[Hashable], z: float = Z_95
) -> tuple[float, float, float]:
    """(low, high, n_eff): the Wilson interval of the share of true outcomes on the effective number of prompts."""
    n_eff = effective_n(outcomes, templates, facts)
    if not outcomes:
        return math.nan, math.nan, 0.0
    low, high = wilson_interval(sum(outcomes) / len(outcomes) * n_eff, n_eff, z)
    return low, high, n_eff


def clustered_difference(
    differences: Sequence[float],
    templates: Sequence[Hashable],
    facts: Sequence[Hashable],
    extra_variance: float = 0.0,
    z: float = Z_95,
) -> tuple[float, float, float]:
    """(mean, low, high) of paired per-prompt differences, clustered by template and fact, plus `extra_variance`."""
    n = len(differences)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(differences) / n
    if all(d == differences[0] for d in differences):
        bound = wilson_interval(0, _fewest_clusters(templates, facts), z)[1]
        half = math.sqrt(bound**2 + z * z * extra_variance)
        return mean, max(-1.0, mean - half), min(1.0, mean + half)
    naive = sum((d - mean) ** 2 for d in differences) / n**2
    half = z * math.sqrt(max(two_way_variance(differences, templates, facts), naive) + extra_variance)
    return mean, mean - half, mean + half
