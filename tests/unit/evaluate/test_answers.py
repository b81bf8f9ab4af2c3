"""Answer extraction (evaluate/answers.py) on tricky generated strings, and numeric matching."""

from __future__ import annotations

import pytest

from arithmech.evaluate.answers import (
    choice_letter,
    cut_at_new_turn,
    extract_choice,
    extract_number,
    find_numbers,
    format_number,
    numbers_match,
)

NUMBER_CASES = [
    # (generated text, expected value or None)
    ("$1,200.50", 1200.5),
    ("-3", -3.0),
    ("1/2", 0.5),
    ("The answer is 7.", 7.0),
    ("The answer is $1,200.50.", 1200.5),
    ("It costs $-5 now", -5.0),
    ("a loss of -$12", -12.0),
    ("the temperature fell to \u22127 degrees", -7.0),
    ("5-3=2", 2.0),
    ("10 - 3", 3.0),
    ("x = -3.", -3.0),
    ("3 1/2 cups", 3.5),
    ("she ate 3/4 of it", 0.75),
    ("12 / 4 = 3", 3.0),
    ("50% of them", 50.0),
    (".5 of a pie", 0.5),
    ("1,234,567.8 people", 1234567.8),
    ("1,2,3", 3.0),
    ("In 2019 there were 7", 7.0),
    ("no number here", None),
    ("", None),
    ("divide 1/0", None),
    ("answer: 42 because 7", 42.0),
    ("The answer is 8. He then had 3 left", 8.0),
    ("answer is 4. Wait, the answer is 6", 6.0),
    ("The answer is five, then 3 more", 3.0),
    ("US$5", 5.0),
    ("She has 18 apples.\n\nQ: Tom has 5 apples. How many?\nA: The answer is 5.", 18.0),
    ("So 9 * 2 = 18.\nQuestion: What is 3 + 4?", 18.0),
    ("Q: 4", 4.0),
    ("The answer is 1,000,000.", 1_000_000.0),
    ("the answer is 0.25", 0.25),
    ("She pays 2.50 dollars", 2.5),
    ("version x3 then 4", 4.0),
]


@pytest.mark.parametrize(("text", "expected"), NUMBER_CASES)
def test_extract_number(text: str, expected: float | None) -> None:
    got = extract_number(text)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got == pytest.approx(expected, abs=1e-12)


def test_find_numbers_reads_operators_as_operators() -> None:
    assert find_numbers("5-3=2 and -4, 1,200 or 1,2") == [5.0, 3.0, 2.0, -4.0, 1200.0, 1.0, 2.0]


def test_cut_at_new_turn_keeps_first_line() -> None:
    assert cut_at_new_turn("Q: 3\nA: 4\nQ: 5") == "Q: 3\nA: 4"
    assert cut_at_new_turn("text\n  Question : more") == "text"
    assert cut_at_new_turn("no turn") == "no turn"


@pytest.mark.parametrize(
    ("value", "text"),
    [(18.0, "18"), (-3.0, "-3"), (1200.5, "1200.5"), (0.25, "0.25"), (9.43, "9.43"), (1 / 3, "0.333333"), (None, None)],
)
def test_format_number(value: float | None, text: str | None) -> None:
    assert format_number(value) == text


@pytest.mark.parametrize(
    ("predicted", "gold", "match"),
    [(18.0, "18", True), (18.00009, "18", True), (18.0002, "18", False), (9.43, "9.43", True), (-3.0, "-3", True),
     (3.0, "-3", False), (None, "0", False), (0.5, 0.5, True)],
)
def test_numbers_match(predicted: float | None, gold: str | float, match: bool) -> None:
    assert numbers_match(predicted, gold) is match


def test_extraction_then_match_end_to_end() -> None:
    assert numbers_match(extract_number("Total: $1,200.50.\n\nQ: next one costs $3"), "1200.5")
    assert not numbers_match(extract_number("I am not sure."), "0")


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("(B)", 4, 1),
        ("B", 4, 1),
        ("C. Paris", 4, 2),
        ("The answer is (D).", 4, 3),
        ("answer: A", 4, 0),
        ("A man walks into a bar, so (C)", 4, 2),
        ("A man walks into a bar", 4, None),
        ("The answer is E", 4, None),
        ("The answer is E", 5, 4),
        ("I think it is (B).\nQuestion: (A)", 4, 1),
        ("", 4, None),
    ],
)
def test_extract_choice(text: str, n: int, expected: int | None) -> None:
    assert extract_choice(text, n) == expected


def test_choice_letter() -> None:
    assert [choice_letter(i) for i in range(5)] == ["A", "B", "C", "D", "E"]
