"""Reading the answer out of a model's text: the final number of a math solution, or a choice letter.

Background
    Chain-of-thought evaluation (Wei et al. 2022; Kojima et al. 2022) lets the model write a solution and reads
    the answer off its end: the number after "The answer is", else the last number written. Generated text
    often runs on into a new, invented question ("\\n\\nQ: ..."), whose numbers must not be read, so the text
    is cut at the first new "Question:" / "Q:" turn first.

Rules (`extract_number`)
    1. Cut the text at the first line that starts a new turn: "Q:", "Question:" (a newline, then optional
       spaces, then the marker). Text before the first newline is never cut.
    2. If "answer is" / "answer:" / "answer =" occurs (any case), take the first number after the LAST such
       marker that is followed by a number. Otherwise take the last number in the text.
    3. A number is read as: an optional sign ("-" or the minus sign U+2212, only where it does not follow a
       letter, digit or ")" -- so "5-3" is 5 and 3, not 5 and -3), an optional "$" on either side of the sign,
       digits with optional thousands commas (groups of exactly three: "1,200" is 1200, "1,2" is 1 and 2), an
       optional decimal part (".5" after a digit; a sentence-final "7." is 7), or a fraction "a/b" (one or two
       spaces allowed around "/"; "1/2" is 0.5; a zero denominator is not a number), or a mixed number
       "3 1/2" (3.5); then an optional "%" which is dropped ("50%" is 50, as the data sets write percentages).
       Spelled-out numbers ("seven") and scientific notation are not read.
    4. Match (`numbers_match`): |predicted - gold| < 1e-4, the rule of the data sets' PROVENANCE.md; no number
       read counts as wrong.

    The canonical string of a value (`format_number`) follows the data sets' answer convention: no thousands
    separators, no trailing ".0", a sign only when negative ("1200.5", "-3", "18").

Choice letters (`extract_choice`) are for generated answers to lettered options ("(B)", "B.", "answer is B");
the evaluate stage scores choices by log-likelihood and uses only `choice_letter` to label options.

Usage
    >>> extract_number("She pays $1,200.50 in total. The answer is $1,200.50.")
    1200.5
    >>> numbers_match(extract_number("so 1/2 of them"), "0.5")
    True
"""

from __future__ import annotations

import re
from fractions import Fraction

LETTERS = "ABCDEFGHIJ"
MATCH_TOLERANCE = 1e-4

_NEW_TURN = re.compile(r"\n[ \t]*(?:Question|Q)[ \t]*:")
_MARKER = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)
_SIGN = r"(?:(?<![\w)])[-\u2212])"
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+(?![\d,]\d)|\d+)"
_NUMBER = re.compile(
    rf"""
    (?<![\w.])                                    # not inside a word or after a decimal point
    (?P<sign1>{_SIGN})?\$?(?P<sign2>{_SIGN})?\$?  # -$5, $-5, -5
    (?:
        (?P<whole>\d+)\ (?P<mnum>\d+)\s?/\s?(?P<mden>\d+)(?![\d/])  # mixed number 3 1/2
      | (?P<num>\d+)\s?/\s?(?P<den>\d+)(?![\d/])                    # fraction 1/2
      | (?P<int>{_DIGITS})(?P<frac>\.\d+)?                          # 1,200.50
      | (?P<bare>\.\d+)                                             # .5
    )
    %?
    """,
    re.VERBOSE,
)
_AFTER_MARKER = re.compile(r"\s*\(?([A-J])(?![A-Za-z])")
_OPENING = re.compile(r"\(?([A-J])(?:[.):]|$)")
_PAREN = re.compile(r"\(([A-J])\)")


def cut_at_new_turn(text: str) -> str:
    """The text before the first line that starts a new "Q:" / "Question:" turn."""
    match = _NEW_TURN.search(text)
    return text[: match.start()] if match else text


def _value(match: re.Match[str]) -> float | None:
    """The number a `_NUMBER` match stands for, or None (a fraction with a zero denominator)."""
    g = match.groupdict()
    negative = bool(g["sign1"] or g["sign2"])
    if g["mnum"] is not None:
        if int(g["mden"]) == 0:
            return None
        value = int(g["whole"]) + Fraction(int(g["mnum"]), int(g["mden"]))
    elif g["num"] is not None:
        if int(g["den"]) == 0:
            return None
        value = Fraction(int(g["num"]), int(g["den"]))
    elif g["int"] is not None:
        value = Fraction(g["int"].replace(",", "") + (g["frac"] or ""))
    else:
        value = Fraction("0" + g["bare"])
    return float(-value if negative else value)


def find_numbers(text: str) -> list[float]:
    """Every number in `text`, in order (rule 3 of the module docstring)."""
    return [v for v in (_value(m) for m in _NUMBER.finditer(text)) if v is not None]


def extract_number(text: str) -> float | None:
    """The final answer of a generated solution, or None if it holds no number (rules 1-3)."""
    text = cut_at_new_turn(text)
    for marker in reversed(list(_MARKER.finditer(text))):
        after = find_numbers(text[marker.end():])
        if after:
            return after[0]
    numbers = find_numbers(text)
    return numbers[-1] if numbers else None


def format_number(value: float | None) -> str | None:
    """The data sets' canonical string: 1200.5 -> "1200.5", 18.0 -> "18", -3.0 -> "-3"."""
    if value is None:
        return None
    if value == int(value):
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


def numbers_match(predicted: float | None, gold: str | float, tolerance: float = MATCH_TOLERANCE) -> bool:
    """Whether a predicted value equals the gold answer (|difference| < tolerance); None never matches."""
    if predicted is None:
        return False
    return abs(predicted - float(gold)) < tolerance


def choice_letter(index: int) -> str:
    """0 -> "A", 4 -> "E"."""
    return LETTERS[index]


def extract_choice(text: str, n_choices: int) -> int | None:
    """The index of the option letter a generated answer names, or None.

    In order: the first letter after the last "answer is" / "answer:" ("The answer is (B)", "answer: C"); a
    letter that opens the answer ("B", "B.", "(B) Paris", not "A man"); a parenthesised letter anywhere ("so (C)").
    A bare capital inside prose ("A man ...") is not read. Only the first n_choices letters count.
    """
    text = cut_at_new_turn(text).strip()
    valid = LETTERS[:n_choices]
    markers = list(_MARKER.finditer(text))
    candidates = []
    if markers:
        candidates.append(_AFTER_MARKER.match(text[markers[-1].end():]))
    candidates.append(_OPENING.match(text))
    candidates.extend(_PAREN.finditer(text))
    for match in candidates:
        if match is not None and match.group(1) in valid:
            return valid.index(match.group(1))
    return None
