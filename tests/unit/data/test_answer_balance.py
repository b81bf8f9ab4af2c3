"""Samples that one answer dominates (issue 22.6): division 10-99 made 90 of its 196 problems n / n = 1; the
generator now draws such queries evenly over the answer values, seeded, and a set one answer still dominates is
named in a warning with its share."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from arithmech.data.answer_balance import DOMINANT_SHARE, warn_dominant
from arithmech.data.generate import GenerationConfig, generate_pairs


def _answers(operation: str, lo: int, hi: int, single_digit: bool, seed: int = 0) -> list[str]:
    cfg = GenerationConfig(operations=(operation,), operand_min=lo, operand_max=hi, n_per_template=18,
                           single_digit_answer=single_digit, seed=seed)  # fmt: skip
    return [p.answer for p in generate_pairs(cfg)]


def test_division_of_two_digit_operands_is_drawn_evenly_over_its_answers(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        answers = _answers("division", 10, 99, single_digit=False)
    counts = Counter(answers)
    assert sorted(counts) == [str(q) for q in range(1, 10)]  # quotients 1..9, each 18 * 12 / 9 = 24 times
    assert set(counts.values()) == {24}
    assert "the answer 1 holds 90 of the 196 valid problems with operands 10-99" in caplog.text
    assert "WARNING" not in caplog.text
    assert answers == _answers("division", 10, 99, single_digit=False)  # seeded
    assert answers != _answers("division", 10, 99, single_digit=False, seed=1)


def test_multiplication_zeros_are_balanced_and_addition_is_left_as_it_was() -> None:
    assert Counter(_answers("multiplication", 0, 9, single_digit=True))["0"] <= 0.11 * 12 * 18  # was 19 of 42
    addition = Counter(_answers("addition", 0, 9, single_digit=True))
    assert max(addition.values()) < DOMINANT_SHARE * 12 * 18 and addition["0"] < addition["9"]  # not rebalanced


def test_a_range_too_large_to_enumerate_warns_with_the_share(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        answers = _answers("division", 10, 500, single_digit=False)
    ones = Counter(answers)["1"]
    share = f"{ones} of the {len(answers)} division prompts ({100 * ones / len(answers):.0f}%) have the answer 1"
    assert ones > DOMINANT_SHARE * len(answers) and share in caplog.text, caplog.text
    assert "operand ranges of at most 200 values" in caplog.text


def test_a_reference_set_of_mostly_one_answer_is_named(caplog: pytest.LogCaptureFixture) -> None:
    cfg = GenerationConfig(operations=("division",), operand_min=10, operand_max=99, n_per_template=8,
                           single_digit_answer=False)  # fmt: skip
    pairs = generate_pairs(cfg)
    kept = [p for p in pairs if p.answer == "1"][:5] + [p for p in pairs if p.answer != "1"][:3]  # as if filtered
    with caplog.at_level(logging.WARNING):
        warn_dominant(kept, "the reference set", "fix it")
        warn_dominant(kept[:4], "four prompts", "fix it")  # too few to call one answer dominant
    assert "the reference set: 5 of the 8 division prompts (62%) have the answer 1" in caplog.text
    assert "four prompts" not in caplog.text
