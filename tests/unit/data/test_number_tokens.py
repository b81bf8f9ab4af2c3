"""Single-token numbers read from the tokenizer: digits only on a digit-splitting tokenizer, 0..99 on one with
two-digit number tokens, and one clear error without any."""

from __future__ import annotations

import pytest

from arithmech.data.number_tokens import single_token_numbers
from arithmech.errors import DataError

from tiny_models import make_multidigit_tokenizer, make_tiny_tokenizer


def test_digit_splitting_tokenizer_has_the_ten_digits() -> None:
    tokenizer = make_tiny_tokenizer()
    numbers = single_token_numbers(tokenizer, "3+4=")
    assert numbers.count == 10 and numbers.digit_splitting
    assert numbers.ids == tuple(ord(str(n)) for n in range(10))  # byte tokens: id == byte value


def test_multidigit_tokenizer_has_0_to_99() -> None:
    tokenizer = make_multidigit_tokenizer()
    numbers = single_token_numbers(tokenizer, "12+34=")
    assert numbers.count == 100 and not numbers.digit_splitting
    assert [tokenizer.decode([t]) for t in numbers.ids] == [str(n) for n in range(100)]
    assert single_token_numbers(tokenizer, "", limit=42).count == 42


def test_no_single_token_number_is_one_error() -> None:
    class Words:
        def __call__(self, text: str) -> dict[str, list[int]]:
            return {"input_ids": [ord(c) for c in text.replace("0", "00")]}  # "0" is always two tokens

    with pytest.raises(DataError, match="no number as one token"):
        single_token_numbers(Words(), "x=")
