"""Clustered intervals: the Wilson interval's known values; on outcomes correlated within templates the clustered
interval is wider than the naive Wilson one and covers the truth, on independent outcomes it is close to Wilson."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from arithmech.evaluate.clustered_interval import (
    clustered_difference,
    clustered_wilson,
    effective_n,
    wilson_interval,
)

T, P = 6, 20  # the subtraction test part's shape: 6 templates x 20 problems
TEMPLATES = [t for t in range(T) for _ in range(P)]
FACTS = [p for _ in range(T) for p in range(P)]


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
    assert (low, high) == pytest.approx(wilson_interval(0.5 * n_eff, n_eff))
    assert high - low > 3 * (naive[1] - naive[0]) and low < naive[0] and high > naive[1]
    by_fact = [f < 10 for f in FACTS]  # the same along the other factor
    assert 15 < effective_n(by_fact, TEMPLATES, FACTS) < 25  # about P = 20


def test_independent_outcomes_give_about_the_wilson_interval() -> None:
    rng = random.Random(0)
    ratios = []
    for _ in range(200):
        outcomes = simulated(rng, 0.0, 0.0)
        low, high, _ = clustered_wilson(outcomes, TEMPLATES, FACTS)
        naive = wilson_interval(sum(outcomes), len(outcomes))
        ratios.append((high - low) / (naive[1] - naive[0]))
    assert min(ratios) >= 1.0 - 1e-12 and 1.0 < statistics.fmean(ratios) < 1.2  # never narrower; ~10% wider


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
    assert clustered_wilson([True] * 120, TEMPLATES, FACTS)[:2] == pytest.approx(wilson_interval(T, T))
    one_template = [0] * P
    assert effective_n([True] * P, one_template, list(range(P))) == P  # nothing to learn about other templates
    assert effective_n([f % 2 == 0 for f in range(P)], one_template, list(range(P))) == pytest.approx(P)
    assert all(math.isnan(x) for x in clustered_wilson([], [], [])[:2])


def test_paired_difference_respects_the_clustering_and_adds_seed_variance() -> None:
    same = clustered_difference([0.0] * 120, TEMPLATES, FACTS)  # right on the same prompts: not "exactly 0"
    assert same == pytest.approx((0.0, -wilson_interval(0, T)[1], wilson_interval(0, T)[1]))
    by_template = [1.0 if t < 3 else 0.0 for t in TEMPLATES]  # one model better on 3 templates only
    mean, low, high = clustered_difference(by_template, TEMPLATES, FACTS)
    naive_half = 1.959963984540054 * math.sqrt(statistics.pvariance(by_template) / 120)
    assert mean == 0.5 and (high - low) / 2 > 3 * naive_half and low < 0.5 - 3 * naive_half
    _, low2, high2 = clustered_difference(by_template, TEMPLATES, FACTS, extra_variance=0.01)
    assert high2 - low2 > high - low
