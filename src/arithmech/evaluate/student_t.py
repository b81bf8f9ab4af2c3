"""Student's t quantiles for small-sample intervals, exact, in the standard library (no scipy).

Background
    A mean whose variance is estimated from few independent units (5 templates, 3 seeds) is not normal after
    studentising: (mean - mu) / se follows Student's t with the estimate's degrees of freedom (df), whose tails are
    heavier than the normal's. A 95% interval is then mean +- t_{0.975, df} se, with t_{0.975, 4} = 2.776 against
    z = 1.960; as df grows, t -> z.

Formula
    For t >= 0 and df = nu, the upper tail is P(T > t) = I_x(nu / 2, 1 / 2) / 2 with x = nu / (nu + t^2), I the
    regularised incomplete beta function (Abramowitz & Stegun 26.7.1, 26.5.27), here the continued fraction of
    Numerical Recipes (Press et al. 2007, sec. 6.4, evaluated by Lentz's method) with x and 1 - x = t^2 / (nu + t^2)
    both computed without cancellation. `t_quantile` bisects on t (the tail falls as t grows) to the last bit: within
    a relative 1e-11 of scipy's for df from 1 to 10,000 (at df = 1e8, lgamma's cancellation leaves ~1e-8).
    Non-integer df (Welch-Satterthwaite's) work the same way; df = inf gives the normal quantile.

References: Abramowitz & Stegun (1964) 26.5, 26.7; Press, Teukolsky, Vetterling & Flannery (2007), Numerical
Recipes, 3rd ed., sec. 6.4 and 6.14.
"""

from __future__ import annotations

import math
from statistics import NormalDist

_TINY = 1e-300
_EPS = 1e-16


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes `betacf`), for x < (a + 1) / (a + b + 2)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 100_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"the incomplete beta fraction did not converge (a={a}, b={b}, x={x})")


def incomplete_beta(a: float, b: float, x: float, one_minus_x: float | None = None) -> float:
    """The regularised incomplete beta function I_x(a, b), 0 <= x <= 1, a, b > 0. `one_minus_x`, when given, is
    1 - x computed without cancellation (t_quantile's t^2 / (nu + t^2)), so x near 1 keeps its precision."""
    y = 1.0 - x if one_minus_x is None else one_minus_x
    if x <= 0.0 or y <= 0.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, y) / b


def t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom, t >= 0: I_x(df / 2, 1 / 2) / 2, x = df / (df + t^2)."""
    return incomplete_beta(df / 2, 0.5, df / (df + t * t), t * t / (df + t * t)) / 2


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with `df` degrees of freedom (df > 0; math.inf: the normal quantile)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, not p={p}, df={df}")
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    tail = 1.0 - p
    low, high = 0.0, 1.0
    while t_upper_tail(high, df) > tail:  # the tail falls as t grows: bracket the quantile
        low, high = high, 2 * high
    while (mid := (low + high) / 2) not in (low, high):  # bisect to the last bit
        low, high = (mid, high) if t_upper_tail(mid, df) > tail else (low, mid)
    return mid


def welch_satterthwaite(parts: list[tuple[float, float]]) -> float:
    """The effective degrees of freedom of a sum of independent variance estimates, given as (variance, df):
    (sum v_i)^2 / sum(v_i^2 / df_i) (Satterthwaite 1946; Welch 1947). Parts with variance 0 or df = inf add
    nothing to the denominator; inf when no part is estimated (all known or all 0)."""
    total = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if v > 0 and not math.isinf(df))
    return math.inf if denominator == 0 else total * total / denominator
