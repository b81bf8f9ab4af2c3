"""Place value of an answer token (units, tens, hundreds), the index of every per-digit table.

Background
    Scored token by token (`tokens.tokenize_pairs(..., answer_digits=True)`), answers of different lengths put
    different digits at the same token index: the first token of 27 is its tens, of 7 its units. Tables indexed by
    token index would mix the two (subtraction with operands 10-49 gives answers of one and two digits), so every
    per-digit table indexes a token by its place value, counted from the units: place 0 = units, 1 = tens,
    2 = hundreds. Whatever the answer's length, one place row holds only digits of that place.

Rule
    Every answer token must be one digit (a tokenizer that writes numbers digit by digit: SmolLM2, Llama 2,
    Gemma, Qwen2); token j of an answer of m tokens (1-based) then has place m - j. A token of several digits
    (GPT-2's "42", Llama 3's "123") spans several places, and a sign or a decimal point has none, so such answers
    are refused with --answer-digits (`pair_checks.answer_tokens_problem`). The one token of an answer scored
    whole (without --answer-digits) is given place 0.

Usage
    >>> token_places(3)        # [2, 1, 0]: hundreds, tens, units, in writing order
    >>> place_name(1)          # "tens"
"""

from __future__ import annotations

PLACE_NAMES = ("units", "tens", "hundreds", "thousands")
DIGITS = frozenset("0123456789")


def token_places(n_tokens: int) -> list[int]:
    """The place of each token of an answer of `n_tokens` one-digit tokens, in writing order."""
    return list(range(n_tokens - 1, -1, -1))


def place_name(place: int) -> str:
    """"units", "tens", "hundreds", "thousands", then "10^4", "10^5", ...: the label of a place in tables."""
    return PLACE_NAMES[place] if place < len(PLACE_NAMES) else f"10^{place}"


def is_one_digit(piece: str) -> bool:
    """Whether a decoded answer token is one digit 0-9 (a space merged into it aside)."""
    text = piece.strip()
    return len(text) == 1 and text in DIGITS
