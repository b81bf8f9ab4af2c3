"""Clustered intervals: the Wilson interval's known values; on outcomes correlated within templates the clustered
interval is wider than the naive Wilson one and covers the truth, on independent outcomes it is close to Wilson
times t / z; every quantile is Student's t on min(templates, facts) - 1 degrees of freedom (known t quantiles,
wider with fewer clusters, z with many), and seed variance enters on its own df by Welch-Satterthwaite."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from arithmech.evaluate.clustered_interval import (
    Z_95,
    cluster_df,
    clustered_difference,
    clustered_wilson,
    effective_n,
    two_way_variance,
    wilson_interval,
)
from arithmech.evaluate.student_t import t_quantile, welch_satterthwaite

T, P = 6, 20  # the subtraction test part's shape: 6 templates x 20 problems
TEMPLATES = [t for t in range(T) for _ in range(P)]
FACTS = [p for _ in range(T) for p in range(P)]
T_5 = 2.5705818356363146  # t_{0.975, 5}: 6 templates, the fewer clusters
T_95 = {1: 12.706204736174694, 2: 4.302652729749462, 3: 3.1824463052837078, 4: 2.7764451051977934,
        5: T_5, 10: 2.228138851986274, 30: 2.0422724563012378}  # fmt: skip
"""Two-sided 95% quantiles of Student's t (scipy.stats.t.ppf(0.975, df); Abramowitz & Stegun table 26.10 to 3
decimals)."""


def simulated(rng: random.Random, sd_template: float, sd_fact: float) -> list[bool]:
    """Outcomes with a random logit effect per template and per fact (0, 0: independent coin flips)."""
    te, fe = [rng.gauss(0, sd_template) for _ in range(T)], [rng.gauss(0, sd_fact) for _ in range(P)]
    return [rng.random() < 1 / (1 + math.exp(-(te[t] + fe[f]))) for t, f in zip(TEMPLATES, FACTS, strict=True)]


def test_wilson_interval_known_values() -> None:
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)
    assert wilson_interval(20, 20) == pytest.approx((0.8389, 1.0), abs=1e-4)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_perfectly_template_correlated_outcomes_are_worth_about_one_prompt_per_template() -> None:
    outcomes = [t < 3 for t in TEMPLATES]  # 3 templates always right, 3 always wrong: 60 of 120
    low, high, n_eff = clustered_wilson(outcomes, TEMPLATES, FACTS)
    naive = wilson_interval(60, 120)
    assert 4 < n_eff < T  # 120 prompts, 6 independent units (minus the small-sample correction)
    assert (low, high) == pytest.approx(wilson_interval(0.5 * n_eff, n_eff, T_5))  # t on 6 - 1 df, not z
    assert high - low > 3 * (naive[1] - naive[0]) and low < naive[0] and high > naive[1]
    by_fact = [f < 10 for f in FACTS]  # the same along the other factor
    assert 15 < effective_n(by_fact, TEMPLATES, FACTS) < 25  # about P = 20


def test_independent_outcomes_give_about_the_wilson_interval_with_t() -> None:
    """With 6 templates the quantile is t_{0.975, 5} = 2.57: about that over 1.96 wider than Wilson (the variance
    itself ~10% above p (1 - p) / n); with 40 templates x 40 facts the interval is about Wilson's own."""
    rng = random.Random(0)
    ratios = []
    for _ in range(200):
        outcomes = simulated(rng, 0.0, 0.0)
        low, high, _ = clustered_wilson(outcomes, TEMPLATES, FACTS)
        naive = wilson_interval(sum(outcomes), len(outcomes), T_5)
        ratios.append((high - low) / (naive[1] - naive[0]))
    assert min(ratios) >= 1.0 - 1e-12 and 1.0 < statistics.fmean(ratios) < 1.2  # never narrower; ~10% wider
    many = [t for t in range(40) for _ in range(40)], [f for _ in range(40) for f in range(40)]
    outcomes = [rng.random() < 0.5 for _ in range(1600)]
    low, high, _ = clustered_wilson(outcomes, *many)
    naive = wilson_interval(sum(outcomes), 1600)
    assert 1.0 <= (high - low) / (naive[1] - naive[0]) < 1.1


def test_clustered_interval_covers_the_truth_where_wilson_does_not() -> None:
    """A template effect of logit sd 1.5 (phrasings differ a lot): the population accuracy is 0.5 by symmetry;
    the naive interval misses it about half the time, the clustered one about 1 in 12 (6 templates)."""
    rng = random.Random(1)
    covered, naive_covered = 0, 0
    reps = 300
    for _ in range(reps):
        outcomes = simulated(rng, 1.5, 0.0)
        low, high, _ = clustered_wilson(outcomes, TEMPLATES, FACTS)
        n_low, n_high = wilson_interval(sum(outcomes), len(outcomes))
        covered += low <= 0.5 <= high
        naive_covered += n_low <= 0.5 <= n_high
    assert covered / reps > 0.88 and naive_covered / reps < 0.7


def test_all_correct_falls_back_to_the_coarser_factor_and_a_single_template_is_conditional() -> None:
    assert effective_n([True] * 120, TEMPLATES, FACTS) == T
    assert clustered_wilson([True] * 120, TEMPLATES, FACTS)[:2] == pytest.approx(wilson_interval(T, T, T_5))
    one_template = [0] * P
    assert effective_n([True] * P, one_template, list(range(P))) == P  # nothing to learn about other templates
    assert effective_n([f % 2 == 0 for f in range(P)], one_template, list(range(P))) == pytest.approx(P)
    assert all(math.isnan(x) for x in clustered_wilson([], [], [])[:2])


def test_paired_difference_respects_the_clustering_and_adds_seed_variance() -> None:
    same = clustered_difference([0.0] * 120, TEMPLATES, FACTS)  # right on the same prompts: not "exactly 0"
    bound = wilson_interval(0, T, T_5)[1]
    assert same[:4] == pytest.approx((0.0, -bound, bound, T - 1))
    by_template = [1.0 if t < 3 else 0.0 for t in TEMPLATES]  # one model better on 3 templates only
    mean, low, high, df, df_clusters, templates, facts = clustered_difference(by_template, TEMPLATES, FACTS)
    naive_half = Z_95 * math.sqrt(statistics.pvariance(by_template) / 120)
    assert mean == 0.5 and (high - low) / 2 > 3 * naive_half and low < 0.5 - 3 * naive_half
    assert (df, df_clusters, templates, facts) == (5, 5, T, P)
    assert mean - low == pytest.approx(T_5 * math.sqrt(two_way_variance(by_template, TEMPLATES, FACTS)))  # high: 1
    seeds = clustered_difference(by_template, TEMPLATES, FACTS, extra=[(0.01, 4), (0.01, 4)])
    assert seeds.high - seeds.low > high - low
    cluster = two_way_variance(by_template, TEMPLATES, FACTS)  # Welch-Satterthwaite over the three parts
    want_df = (cluster + 0.02) ** 2 / (cluster**2 / 5 + 2 * 0.01**2 / 4)
    assert seeds.df == pytest.approx(want_df) and 4 < seeds.df < 5 + 4 + 4
    assert seeds.mean - seeds.low == pytest.approx(t_quantile(0.975, want_df) * math.sqrt(cluster + 0.02))


def test_t_quantiles_are_the_known_values() -> None:
    for df, value in T_95.items():
        assert t_quantile(0.975, df) == pytest.approx(value, rel=1e-12)
        assert t_quantile(0.025, df) == pytest.approx(-value, rel=1e-12)
    for p in (0.6, 0.9, 0.99, 0.9995):  # closed forms: Cauchy (df 1) and df 2
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)
    assert T_95[4] > t_quantile(0.975, 4.5) > T_95[5]  # Welch-Satterthwaite's df need not be whole
    assert t_quantile(0.975, math.inf) == pytest.approx(Z_95, rel=1e-12)
    assert t_quantile(0.975, 10_000) == pytest.approx(Z_95, rel=2e-4)


def test_welch_satterthwaite_degrees_of_freedom() -> None:
    assert welch_satterthwaite([(0.3, 4.0)]) == 4.0  # one estimated part: its own df
    assert welch_satterthwaite([(0.3, 4.0), (0.3, 4.0)]) == pytest.approx(8.0)  # two equal parts: the sum
    assert welch_satterthwaite([(0.3, 4.0), (0.0, 1.0)]) == 4.0  # a zero part adds nothing
    assert welch_satterthwaite([(0.3, math.inf)]) == math.inf and welch_satterthwaite([]) == math.inf
    assert 2.0 < welch_satterthwaite([(0.3, 2.0), (0.1, 30.0)]) < 32.0


@pytest.mark.parametrize("kind", ["difference", "proportion"])
def test_interval_widens_with_fewer_clusters_and_is_z_with_many(kind: str) -> None:
    """The same outcomes, grouped into G templates (facts one per prompt): the half-width over the standard error
    is t_{0.975, G - 1}, so it grows as G falls and is z's at G = 2000 (40 prompts per template)."""
    rng = random.Random(3)
    n = 2000 * 40
    values = [float(rng.random() < 0.4) for _ in range(n)]
    ratios = {}
    for g in (3, 5, 10, 2000):
        templates, facts = [i % g for i in range(n)], list(range(n))
        assert cluster_df(templates, facts) == g - 1
        variance = max(two_way_variance(values, templates, facts), statistics.pvariance(values) / n)
        if kind == "difference":
            mean, low, high, df, *_ = clustered_difference(values, templates, facts)
            assert df == g - 1
            ratios[g] = (high - low) / 2 / math.sqrt(variance)
        else:
            p = statistics.fmean(values)
            low, high, n_eff = clustered_wilson([v == 1.0 for v in values], templates, facts)
            assert (low, high) == pytest.approx(wilson_interval(p * n_eff, n_eff, t_quantile(0.975, g - 1)))
            ratios[g] = (high - low) / (wilson_interval(p * n_eff, n_eff)[1] - wilson_interval(p * n_eff, n_eff)[0])
    if kind == "difference":
        assert ratios[3] == pytest.approx(T_95[2]) and ratios[5] == pytest.approx(T_95[4])
        assert ratios[10] == pytest.approx(t_quantile(0.975, 9))
        assert ratios[2000] == pytest.approx(Z_95, rel=1e-3)
    assert ratios[3] > ratios[5] > ratios[10] > ratios[2000]
    assert kind == "difference" or ratios[2000] == pytest.approx(1.0, rel=1e-3)
