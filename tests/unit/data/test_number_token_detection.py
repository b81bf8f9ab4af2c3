"""Single-token numbers are read from the tokenizer: digits on a digit splitter, 0..999 where they exist."""

from __future__ import annotations

import re

import pytest
from transformers import PreTrainedTokenizerFast

from arithmech.data.number_tokens import single_token_numbers
from arithmech.errors import DataError


class GroupTokenizer:
    """Numbers split into groups of `width` digits (Llama 3: 3), every other character one token."""

    def __init__(self, width: int) -> None:
        self.pattern = re.compile(rf"\d{{1,{width}}}|\D")
        self.vocab: dict[str, int] = {}

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [self.vocab.setdefault(t, len(self.vocab)) for t in self.pattern.findall(text)]}


def test_digit_splitting_tokenizer_has_ten(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    numbers = single_token_numbers(tiny_tokenizer)
    assert (numbers.count, numbers.digit_splitting) == (10, True)
    assert numbers.ids == tuple(tiny_tokenizer.convert_tokens_to_ids(list("0123456789")))


def test_three_digit_groups_give_a_thousand() -> None:
    numbers = single_token_numbers(GroupTokenizer(3))
    assert numbers.count == 1000 and len(set(numbers.ids)) == 1000 and not numbers.digit_splitting
    assert single_token_numbers(GroupTokenizer(2)).count == 100
    assert single_token_numbers(GroupTokenizer(3), limit=50).count == 50


def test_no_number_token_is_one_sentence() -> None:
    class TwoTokenDigits(GroupTokenizer):  # every digit is two tokens (a marker, then the digit)
        def __call__(self, text: str) -> dict[str, list[int]]:
            pieces = [p for c in text for p in (("#", c) if c.isdigit() else (c,))]
            return {"input_ids": [self.vocab.setdefault(p, len(self.vocab)) for p in pieces]}

    with pytest.raises(DataError, match="writes no number as one token"):
        single_token_numbers(TwoTokenDigits(3))
