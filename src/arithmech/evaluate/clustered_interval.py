"""Confidence intervals for accuracies measured on templates crossed with problems, not on independent prompts.

Background
    The arithmetic test part asks every held-out template on every held-out problem (subtraction: 5 templates x
    22 problems = 110 prompts). Two prompts of one template share its phrasing, two of one problem share its
    numbers, so their outcomes are correlated and the 110 are worth fewer independent draws; the Wilson interval
    on n = 110 is then too narrow. Problems are clustered by their fact (data/facts.py), so 3 + 5 and
    5 + 3, or 7 - 2 and 7 - 5, count as one unit.

Method: two-way cluster-robust variance of a mean (Cameron, Gelbach & Miller 2011), y_i per prompt, e_i = y_i - mean:

        V_g     = G_g / (G_g - 1) * sum_{c in g} (sum_{i in c} e_i)^2 / n^2      for g = template, fact (G_g clusters)
        V_cell  = n / (n - 1) * sum_i e_i^2 / n^2                                  (each prompt its own cluster)
        V       = max(V_template + V_fact - V_cell, p (1 - p) / n)                 (never below independent draws)

    A factor with one cluster adds nothing (its residuals sum to 0): the interval is then conditional on that
    template or problem.

Small samples: t on G - 1 degrees of freedom, not z
    V is estimated from G_g cluster sums, so it is about as uncertain as a variance from G_g draws: with 5
    templates, z = 1.96 gives intervals that cover well under 95%. Cameron & Miller (2015, "few clusters") use
    T(G - 1) critical values in place of z; for two-way clustering the usual convention (Stata's ivreg2 and
    reghdfe) takes the dimension with fewer clusters. Every quantile here is therefore Student's t
    (evaluate/student_t.py) on

        df_clusters = min(G_template, G_fact) - 1          (factors with more than one cluster; none: df = inf, z)

    Cameron & Miller report that T(G - 1) still over-rejects somewhat with very few clusters, so with 5 templates
    the intervals may still be a little narrow, though much less than with z (t_{0.975, 4} = 2.78 vs 1.96).
    - Proportions (`clustered_wilson`): the Wilson interval (evaluate/arithmetic.py) on the effective number of
      independent prompts n_eff = p (1 - p) / V, with k = p n_eff and t_{0.975, df_clusters} in place of z. That
      is Korn & Graubard's (1998) degrees-of-freedom-adjusted effective sample size n_eff (z / t)^2 (their
      t_{n - 1} taken as z) under Wilson's interval: Wilson with t on n_eff equals Wilson with z on n_eff (z / t)^2,
      as the formula depends on z and n only through z^2 / n. It stays in [0, 1] and is not
      degenerate at 0% or 100%; there the residuals are all 0 and V cannot be estimated, so n_eff is the smallest
      number of clusters of a factor with more than one (as if the outcome were constant within each of them).
    - Differences (`clustered_difference`): a paired per-prompt difference d_i of two models on the same prompts,
      plus independent variance parts that the prompts do not show, each with its own df (the seed-to-seed variance
      of each side's accuracy over its S seeds, s^2 / S, has S - 1). The sum's df is Welch-Satterthwaite's
      (Satterthwaite 1946; Welch 1947):

        V_total = V + sum_j v_j
        df      = V_total^2 / (V^2 / df_clusters + sum_j v_j^2 / df_j)
        CI      = mean(d) +- t_{0.975, df} sqrt(V_total)

      With one part it is that part's df; with many clusters and seeds it tends to z. Where every d_i is the same
      (two models right on the same prompts), V is 0 but not known to be: its half-width is then the Wilson upper
      bound of 0 discordant prompts in n_eff (the fallback above, with t_{df_clusters}), so 0 of 6 prompts apart
      is not read as a difference known to be exactly 0, and V = (that bound / t)^2 enters the sum.

Why not a bootstrap over templates and problems: the pigeonhole bootstrap is deterministic only with a fixed RNG
stream, gives [0, 0] at 0% correct, and with 5 templates draws from only 126 distinct template multisets; a wild
cluster bootstrap, the usual remedy for few clusters, has only 2^5 = 32 distinct Rademacher draws at 5 clusters
(Webb 2023 needs 6-point weights there) and no settled two-way form. This closed form is reproducible to the last
digit, handles the incomplete crossing of a `--limit` subset, and reduces to (at most a few percent above) the
plain Wilson interval when outcomes are independent and clusters many (tested).

References: Cameron, Gelbach & Miller (2011), "Robust inference with multiway clustering", J. Business & Economic
Statistics 29(2); Cameron & Miller (2015), "A practitioner's guide to cluster-robust inference", J. Human Resources
50(2); Korn & Graubard (1998), "Confidence intervals for proportions with small expected number of positive counts
estimated from survey data", Survey Methodology 24(2); Satterthwaite (1946), Biometrics Bulletin 2(6); Welch (1947),
Biometrika 34; Webb (2023), "Reworking wild bootstrap-based inference for clustered errors", Canadian J. Economics
56(3).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import NamedTuple

from arithmech.evaluate.student_t import t_quantile, welch_satterthwaite

Z_95 = 1.959963984540054
LEVEL = 0.95


class Difference(NamedTuple):
    """A paired difference with its interval and the degrees of freedom behind the interval's t quantile."""

    mean: float
    low: float
    high: float
    df: float
    """Effective df of the interval (Welch-Satterthwaite over the clustered part and the extra parts)."""
    cluster_df: float
    """min(templates, facts) - 1 over the factors with more than one cluster; inf: none has."""
    templates: int
    facts: int


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


def _fewest_clusters(templates: Sequence[Hashable], facts: Sequence[Hashable]) -> int | None:
    """The fewest clusters of a factor with more than one (None: neither has)."""
    return min([c for c in (len(set(templates)), len(set(facts))) if c > 1], default=None)


def cluster_df(templates: Sequence[Hashable], facts: Sequence[Hashable]) -> float:
    """min(G_template, G_fact) - 1 over the factors with more than one cluster; inf when neither has one."""
    fewest = _fewest_clusters(templates, facts)
    return math.inf if fewest is None else float(fewest - 1)


def _quantile(level: float, df: float) -> float:
    """The two-sided `level` quantile of Student's t on df (t_{0.975, df} at 95%)."""
    return t_quantile((1 + level) / 2, df)


def effective_n(outcomes: Sequence[bool], templates: Sequence[Hashable], facts: Sequence[Hashable]) -> float:
    """How many independent prompts the clustered outcomes are worth for their mean (1 <= n_eff <= n)."""
    n = len(outcomes)
    if n == 0:
        return 0.0
    p = sum(outcomes) / n
    if p in (0.0, 1.0):
        return float(_fewest_clusters(templates, facts) or n)
    variance = max(two_way_variance([float(o) for o in outcomes], templates, facts), p * (1 - p) / n)
    return max(1.0, min(float(n), p * (1 - p) / variance))


def clustered_wilson(
    outcomes: Sequence[bool], templates: Sequence[Hashable], facts: Sequence[Hashable], level: float = LEVEL
) -> tuple[float, float, float]:
    """(low, high, n_eff): the Wilson interval of the share of true outcomes on the effective number of prompts,
    with t on min(templates, facts) - 1 degrees of freedom in place of z."""
    if not outcomes:
        return math.nan, math.nan, 0.0
    n_eff = effective_n(outcomes, templates, facts)
    t = _quantile(level, cluster_df(templates, facts))
    low, high = wilson_interval(sum(outcomes) / len(outcomes) * n_eff, n_eff, t)
    return low, high, n_eff


def clustered_difference(
    differences: Sequence[float],
    templates: Sequence[Hashable],
    facts: Sequence[Hashable],
    extra: Sequence[tuple[float, float]] = (),
    level: float = LEVEL,
) -> Difference:
    """Mean and interval of paired per-prompt differences, clustered by template and fact, plus the independent
    variance parts `extra`, each (variance of the mean, its df), e.g. (s^2 / S, S - 1) for a side's S seeds."""
    n = len(differences)
    g_templates, g_facts = len(set(templates)), len(set(facts))
    df_clusters = cluster_df(templates, facts)
    if n == 0:
        return Difference(math.nan, math.nan, math.nan, math.nan, df_clusters, g_templates, g_facts)
    mean = sum(differences) / n
    if all(d == differences[0] for d in differences):
        t = _quantile(level, df_clusters)
        bound = wilson_interval(0, _fewest_clusters(templates, facts) or n, t)[1]
        variance = (bound / t) ** 2
    else:
        naive = sum((d - mean) ** 2 for d in differences) / n**2
        variance = max(two_way_variance(differences, templates, facts), naive)
    parts = [(variance, df_clusters), *extra]
    df = welch_satterthwaite(parts)
    half = _quantile(level, df) * math.sqrt(sum(v for v, _ in parts))
    return Difference(mean, max(-1.0, mean - half), min(1.0, mean + half), df, df_clusters, g_templates, g_facts)
