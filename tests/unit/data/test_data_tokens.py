"""Tokenization: right padding, END, answer ids, length-mismatch rejection and token roles.

A byte-level BPE with no merges makes every ASCII character one token, so expected positions can be read
off the strings; small fake tokenizers cover the answer-id fallbacks and slow tokenizers.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from arithmech.data import (
    ROLE_CODES,
    GenerationConfig,
    PromptPair,
    answer_token_id,
    generate_pairs,
    pad_id_of,
    tokenize_pairs,
)
from arithmech.errors import DataError


@pytest.fixture(scope="module")
def char_tok() -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


class FakeTokenizer:
    """Maps whole strings to given ids (answer_token_id only needs `tok(text)["input_ids"]`)."""

    def __init__(self, table: dict[str, list[int]], is_fast: bool = False) -> None:
        self.table, self.is_fast = table, is_fast
        self.pad_token_id: int | None = None
        self.eos_token_id: int | None = 9

    def __call__(self, text: str, **kwargs: Any) -> dict[str, list[int]]:
        if text in self.table:
            return {"input_ids": self.table[text]}
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def ids(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tok(text)["input_ids"]


def test_answer_token_id_digit_split(char_tok: PreTrainedTokenizerFast) -> None:
    assert answer_token_id(char_tok, "3 + 4 = ", "7") == ids(char_tok, "7")[0]
    assert answer_token_id(char_tok, "9 + 9 = ", "18") == ids(char_tok, "1")[0]


def test_answer_token_id_merged_space_fallback() -> None:
    # GPT-2 style: " 7" is one token, so "= " + "7" re-tokenizes differently; fall back to "=" + " 7".
    tok = FakeTokenizer({"x = ": [1, 2, 3], "x = 7": [1, 2, 70], "x =": [1, 2], "x = 7 ": [0]})
    assert answer_token_id(tok, "x = ", "7") == 70


def test_answer_token_id_errors() -> None:
    tok = FakeTokenizer({"x=": [1, 2], "x=7": [1, 27], "x= 7": [1, 20, 7]})
    with pytest.raises(DataError, match="are not a prefix"):
        answer_token_id(tok, "x=", "7")
    with pytest.raises(DataError, match="answer .* is empty"):
        answer_token_id(tok, "x=", "")


def test_pad_id_fallbacks(char_tok: PreTrainedTokenizerFast) -> None:
    assert pad_id_of(char_tok) == 0
    assert pad_id_of(FakeTokenizer({})) == 9


def test_right_padding_end_and_answers(char_tok: PreTrainedTokenizerFast) -> None:
    pairs = [
        PromptPair("1 + 2 = ", "1 @ 2 = ", "3"),
        PromptPair("Q: 4 plus 5? A: ", "Q: 4 with 5? A: ", "9"),
    ]
    batch, report = tokenize_pairs(char_tok, pairs)
    assert report.kept == 2 and report.rejected_length_mismatch == 0
    assert batch.ref_ids.shape == batch.cf_ids.shape == batch.ref_mask.shape == (2, 16)
    assert batch.end.tolist() == [7, 15]
    assert batch.ref_ids[0, :8].tolist() == ids(char_tok, "1 + 2 = ")
    assert batch.ref_ids[0, 8:].tolist() == [0] * 8  # right-padded with the pad id
    assert batch.ref_mask[0].tolist() == [1] * 8 + [0] * 8
    assert torch.equal(batch.ref_mask, batch.cf_mask)
    assert batch.answer_ids.tolist() == [ids(char_tok, "3")[0], ids(char_tok, "9")[0]]
    ends = batch.ref_ids[torch.arange(2), batch.end]
    assert ends.tolist() == [ids(char_tok, " ")[0]] * 2


def test_rejects_length_mismatch_and_counts_per_template(char_tok: PreTrainedTokenizerFast) -> None:
    pairs = [
        PromptPair("1 + 2 = ", "1 @ 2 = ", "3", template_id="t1"),
        PromptPair("1 + 2 = ", "1 @@ 2 = ", "3", template_id="t1"),
        PromptPair("2 + 2 = ", "2 plus 2 = ", "4"),
    ]
    batch, report = tokenize_pairs(char_tok, pairs)
    assert (report.kept, report.rejected_length_mismatch) == (1, 2)
    assert report.per_template == {"t1": {"kept": 1, "rejected": 1}, "custom": {"kept": 0, "rejected": 1}}
    assert batch.pairs == [pairs[0]] and batch.ref_ids.shape[0] == 1


def test_all_rejected_raises(char_tok: PreTrainedTokenizerFast) -> None:
    with pytest.raises(DataError, match="all 2 prompt pairs were rejected .* same number of tokens"):
        tokenize_pairs(char_tok, [PromptPair("1 + 2 = ", "1 ++ 2 = ", "3")] * 2)
    with pytest.raises(DataError, match="no prompt pairs"):
        tokenize_pairs(char_tok, [])


def test_roles_follow_spans(char_tok: PreTrainedTokenizerFast) -> None:
    pairs = generate_pairs(GenerationConfig(n_per_template=2, seed=2))
    batch, report = tokenize_pairs(char_tok, pairs)
    assert report.kept == sum(len(p.reference) == len(p.counterfactual) for p in pairs)
    assert batch.roles_available
    ascii_rows = [(i, p) for i, p in enumerate(batch.pairs) if p.reference.isascii()]
    assert len(ascii_rows) > 10
    for i, pair in ascii_rows:
        expected = [0] * len(pair.reference)  # one token per ASCII character
        for role in ("prefix", "operator", "A", "B"):
            start, end = pair.spans[role]
            expected[start:end] = [ROLE_CODES[role]] * (end - start)
        n = len(expected)
        assert batch.roles[i, :n].tolist() == expected
        assert batch.roles[i, n:].eq(0).all()
        assert batch.role_mask("A")[i].sum() == len(pair.a)
        assert batch.end[i] == n - 1
    for i, pair in enumerate(batch.pairs):  # "×" and "÷" are two byte tokens, both the operator's
        assert batch.role_mask("operator")[i].sum() == len(pair.span_text("operator").encode())


def test_counterfactual_tokens_differ_only_at_operator(char_tok: PreTrainedTokenizerFast) -> None:
    pairs = generate_pairs(GenerationConfig(template_ids=("add-eq-1", "sub-qa-3"), n_per_template=4))
    batch, _ = tokenize_pairs(char_tok, pairs)
    differs = batch.ref_ids != batch.cf_ids
    assert differs.any(dim=1).all()
    assert not (differs & ~batch.role_mask("operator")).any()


def test_slow_tokenizer_has_no_roles() -> None:
    batch, _ = tokenize_pairs(FakeTokenizer({}), [PromptPair("ab ", "cd ", "1", spans={"A": (0, 1)})])
    assert not batch.roles_available and batch.roles.eq(0).all()
    assert batch.pad_id == 9
    with pytest.raises(DataError, match="unknown token role"):
        batch.role_mask("C")
