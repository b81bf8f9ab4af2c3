"""Answers of several tokens scored token by token (teacher forcing), and the carry / borrow groups."""

from __future__ import annotations

import pytest
import torch

from arithmech.data import PromptPair, tokenize_pairs
from arithmech.data.carries import carry_group, place_group_masks
from arithmech.data.places import place_name
from arithmech.errors import DataError


def pair(a: int, b: int, op: str = "+", operation: str = "addition") -> PromptPair:
    answer = a + b if operation == "addition" else a - b
    return PromptPair(f"1+1=2\n{a}{op}{b}=", f"1+1=2\n{a}&{b}=", str(answer), "t", operation, None, str(a), str(b))


def test_each_answer_token_is_a_row_on_the_answers_earlier_tokens(tiny_tokenizer) -> None:
    pairs = [pair(27, 15), pair(3, 4), pair(95, 17)]  # answers 42, 7, 112: 2, 1 and 3 tokens
    t, report = tokenize_pairs(tiny_tokenizer, pairs, answer_digits=True)
    assert report.kept == 3  # pairs, not rows
    assert t.answer_place.tolist() == [1, 0, 0, 2, 1, 0]  # tens, units; units; hundreds, tens, units
    assert t.pair_index.tolist() == [0, 0, 1, 2, 2, 2]
    assert t.n_pairs == 3 and t.unique_pairs() == pairs
    texts = [pair(27, 15).reference, pair(27, 15).reference + "4", pair(3, 4).reference]
    texts += [pair(95, 17).reference + prefix for prefix in ("", "1", "11")]
    counterfactuals = [pair(27, 15).counterfactual, pair(27, 15).counterfactual + "4", pair(3, 4).counterfactual]
    counterfactuals += [pair(95, 17).counterfactual + prefix for prefix in ("", "1", "11")]
    for row, (text, cf) in enumerate(zip(texts, counterfactuals, strict=True)):
        n = int(t.end[row]) + 1
        assert t.ref_ids[row, :n].tolist() == tiny_tokenizer(text)["input_ids"], row
        assert t.cf_ids[row, :n].tolist() == tiny_tokenizer(cf)["input_ids"], row  # the reference's prefix
    assert [tiny_tokenizer.decode([int(i)]) for i in t.answer_ids] == ["4", "2", "7", "1", "1", "2"]


def test_taking_pairs_keeps_their_rows_together_and_renumbers(tiny_tokenizer) -> None:
    t, _ = tokenize_pairs(tiny_tokenizer, [pair(27, 15), pair(3, 4), pair(95, 17)], answer_digits=True)
    taken = t.take_pairs([2, 0])
    assert taken.pair_index.tolist() == [0, 0, 0, 1, 1]
    assert taken.answer_place.tolist() == [2, 1, 0, 1, 0]
    assert [p.a for p in taken.unique_pairs()] == ["95", "27"]


def test_without_answer_digits_every_pair_is_one_row(tiny_tokenizer) -> None:
    t, _ = tokenize_pairs(tiny_tokenizer, [pair(3, 4), pair(2, 5)])
    assert t.answer_place.tolist() == [0, 0] and t.pair_index.tolist() == [0, 1]


def test_a_place_holds_only_digits_of_that_place_whatever_the_answer_length(tiny_tokenizer) -> None:
    """Subtraction of operands 10-49 gives answers of one and two digits: the answer's first token is the tens of
    27 but the units of 2, so indexing by token would put both in one row."""
    pairs = [pair(42, 15, "-", "subtraction"), pair(47, 45, "-", "subtraction"), pair(31, 27, "-", "subtraction"),
             pair(49, 10, "-", "subtraction")]  # answers 27, 2, 4, 39  # fmt: skip
    t, _ = tokenize_pairs(tiny_tokenizer, pairs, answer_digits=True)
    digits = [tiny_tokenizer.decode([int(i)]) for i in t.answer_ids]
    for place, name in ((0, "units"), (1, "tens")):
        at = [d for d, q in zip(digits, t.answer_place.tolist(), strict=True) if q == place]
        expected = [p.answer[-1 - place] for p in pairs if len(p.answer) > place]
        assert at == expected, name  # units 7, 2, 4, 9; tens 2, 3
    masks = place_group_masks(t.answer_place, [carry_group(p) for p in t.pairs])
    assert [key for key in masks if key[1] == "all"] == [(0, "all"), (1, "all")]
    assert int(masks[(0, "all")].sum()) == 4 and int(masks[(1, "all")].sum()) == 2
    assert [place_name(p) for p in (0, 1, 2, 3, 4)] == ["units", "tens", "hundreds", "thousands", "10^4"]


def test_an_answer_token_of_several_digits_has_no_place_and_is_refused() -> None:
    from tiny_models import make_multidigit_tokenizer

    tokenizer = make_multidigit_tokenizer()  # 10..99 are one token each: 112 is "11", "2"
    with pytest.raises(DataError, match="not one digit.*place value.*one digit per token"):
        tokenize_pairs(tokenizer, [pair(95, 17)], answer_digits=True)
    with pytest.raises(DataError, match="not one digit"):
        tokenize_pairs(tokenizer, [pair(27, 15)], answer_digits=True)  # "42": one token, two places
    t, _ = tokenize_pairs(tokenizer, [pair(3, 4)], answer_digits=True)  # "7": one digit, the units
    assert t.answer_place.tolist() == [0]


def test_a_longer_answer_points_at_answer_digits(tiny_tokenizer) -> None:
    with pytest.raises(DataError, match="more than one token.*--answer-digits"):
        tokenize_pairs(tiny_tokenizer, [pair(27, 15)])


def test_answer_tokens_must_spell_the_answer(tiny_tokenizer) -> None:
    bad = PromptPair("1+1=2\n27+15=", "1+1=2\n27&15=", " 42", "t", "addition")
    with pytest.raises(DataError, match="first token is a space"):
        tokenize_pairs(tiny_tokenizer, [bad], answer_digits=True)


@pytest.mark.parametrize(
    ("a", "b", "operation", "group"),
    [
        (27, 15, "addition", "carry"),
        (21, 15, "addition", "no carry"),
        (50, 50, "addition", "carry"),  # the tens carry into a hundreds digit
        (40, 52, "addition", "no carry"),
        (95, 5, "addition", "carry"),
        (42, 15, "subtraction", "borrow"),
        (47, 15, "subtraction", "no borrow"),
        (100, 1, "subtraction", "borrow"),
        (7, 7, "subtraction", "no borrow"),
    ],
)
def test_carry_groups(a: int, b: int, operation: str, group: str) -> None:
    assert carry_group(pair(a, b, operation=operation)) == group


def test_no_group_without_whole_operands() -> None:
    assert carry_group(PromptPair("3*4=", "3&4=", "12", operation="multiplication", a="3", b="4")) is None
    assert carry_group(PromptPair("x=", "y=", "12", operation="addition")) is None
    assert carry_group(PromptPair("x=", "y=", "1", operation="addition", a="0.5", b="0.5")) is None


def test_whole_answer_scores() -> None:
    from arithmech.knockout.batched import KnockoutScores

    correct = torch.tensor([[True, True, True, False, True], [True, False, True, True, True]])
    prob = torch.tensor([[0.5, 0.5, 0.9, 0.2, 1.0], [1.0, 0.1, 0.8, 1.0, 1.0]])
    whole = KnockoutScores(correct, prob).whole_answers(torch.tensor([0, 0, 1, 2, 2]))
    assert whole.correct.tolist() == [[True, True, False], [False, True, True]]
    torch.testing.assert_close(whole.answer_prob, torch.tensor([[0.25, 0.9, 0.2], [0.1, 0.8, 1.0]]))
