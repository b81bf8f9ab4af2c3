"""Which whole numbers a tokenizer writes as one token, read from the tokenizer (never assumed).

Background
    Digit-splitting tokenizers (SmolLM2, Llama 2, Gemma, Qwen2) write every number digit by digit, so their
    single-token numbers are 0-9; others (Llama 3, GPT-2 in part) have a token for each number up to 999. The
    analyses of how numbers are represented (Fourier features, heuristic neurons) index the numbers
    0..N-1 that are single tokens, so they need N and the token ids, detected here.

Rule
    After a context (the prompt the number follows; "" for none), n is a single-token number when the tokens of
    context + str(n) are the tokens of context followed by exactly one token (`data.tokens.answer_tokens`, so a
    tokenizer that merges the space into the number, GPT-2's " 7", gets the merged token, as the model sees it).
    The number tokens are 0..N-1 with N the first n (at most `limit`) that is not single-token: a contiguous
    range from 0, so that a number index n always means the number n. ids[n] is the token of n; ids are
    distinct, or the tokenizer is refused.

Usage
    >>> numbers = single_token_numbers(tokenizer, context="3 + 4 = ")
    >>> numbers.count, numbers.digit_splitting        # (10, True) on SmolLM2
    >>> numbers.ids[7]                                # the token the model would write for "7" there
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arithmech.data.tokens import answer_tokens
from arithmech.errors import DataError

DEFAULT_LIMIT = 1000
"""Numbers 0..999 are the most any analysis indexes (the tokenizers that have them stop there)."""


@dataclass(frozen=True)
class NumberTokens:
    """The single-token numbers 0..count-1 after one context, and their token ids (ids[n] writes n)."""

    ids: tuple[int, ...]
    context: str

    @property
    def count(self) -> int:
        """N: numbers 0..N-1 are single tokens."""
        return len(self.ids)

    @property
    def digit_splitting(self) -> bool:
        """True when only the digits 0-9 are single tokens (every longer number is split)."""
        return self.count <= 10


def single_token_numbers(tokenizer: Any, context: str = "", limit: int = DEFAULT_LIMIT) -> NumberTokens:
    """The numbers 0..N-1 (N <= limit) each written as one token after `context`; see the module docstring.

    Raises DataError when "0" is not one token there: the tokenizer has no single-token numbers to index.
    """
    ids: list[int] = []
    for n in range(limit):
        split = answer_tokens(tokenizer, context, str(n))
        if split is None or len(split[1]) != 1:
            break
        ids.append(split[1][0])
    if not ids:
        raise DataError(
            f"the tokenizer writes no number as one token after {context[-30:]!r} (not even 0); the analysis needs "
            "single-token numbers"
        )
    if len(set(ids)) < len(ids):
        raise DataError(
            f"the tokenizer gives two numbers the same token after {context[-30:]!r}; it cannot index numbers"
        )
    return NumberTokens(tuple(ids), context)
