"""The rules a prompt pair must keep for its numbers to mean anything, and how failing rows are named."""

from __future__ import annotations

import pytest

from arithmech.data import PromptPair, tokenize_pairs
from arithmech.data.pair_checks import Findings, Location, Problem, answer_problem, describe, text_problem
from arithmech.errors import DataError


def test_rows_are_named_first_five_then_a_count() -> None:
    in_file = [Location(n, "p.jsonl") for n in (9, 2, 4, 11, 5, 7, 30)]
    assert describe(in_file[:1], 40) == "prompt file p.jsonl, line 9 (1 of 40 pairs)"
    assert describe(in_file[:1], 1) == "prompt file p.jsonl, line 9"
    assert describe(in_file[:3], 40, "line") == "prompt file p.jsonl, lines 2, 4 and 9 (3 of 40 lines)"
    assert describe(in_file, 40) == "prompt file p.jsonl, lines 2, 4, 5, 7, 9 and 2 more (7 of 40 pairs)"
    made = [Location(3, None, "add-eq-1"), Location(8, None, "add-qa-0")]
    assert describe(made, 10) == "pairs 3 and 8 (templates add-eq-1 and add-qa-0) (2 of 10 pairs)"


def test_one_error_names_the_first_problem_and_counts_the_rest() -> None:
    findings = Findings(total=5)
    first, other = Problem("is bad", "x", "fix it"), Problem("is worse", "y", "fix that")
    for number, problem in ((1, first), (2, None), (3, other), (4, first), (5, other)):
        findings.add(Location(number, "p.jsonl"), problem)
    with pytest.raises(DataError) as info:
        findings.refuse()
    assert str(info.value) == (
        "prompt file p.jsonl, lines 1 and 4 (2 of 5 pairs): is bad (x); fix it (2 other pairs with other problems)"
    )
    Findings(total=3).refuse()  # nothing found: no error


@pytest.mark.parametrize(
    ("pair", "what"),
    [
        (PromptPair("3 + 5 = ", "3 @ 5 = ", "8"), None),
        (PromptPair("3 + 5 =", "3 @ 5 =", " 8"), None),  # right for a tokenizer that merges " 8"; tokens decide
        (PromptPair("Q: the capital of France? A: ", "Q: the capital of Spain? A: ", "Paris"), None),
        (PromptPair("The sum of 2 and 2 is ", "The sum of 2 and 2 is ", "4"), "the reference itself"),
        (PromptPair("3 + 5 = ", "3 @ 5 = ", "8 "), "the answer ends with a space"),
        (PromptPair("3 + 5 = ", "3 @ 5 = ", " "), "the answer ends with a space"),
        (PromptPair("3 + 5 = ", "3 @ 5 = ", " 8"), "answer starts with one"),
        (PromptPair("3 + 5 = 8", "3 @ 5 = 8", "8"), "already ends with the answer"),
        (PromptPair("3 + 5 = 8 ", "3 @ 5 = 8 ", "8"), "already ends with the answer"),
        (PromptPair("9 + 9 = 18", "9 @ 9 = 18", "8"), None),  # ends with "18", not with the answer 8
    ],
)
def test_text_rules(pair: PromptPair, what: str | None) -> None:
    problem = text_problem(pair)
    assert (problem is None) if what is None else (problem is not None and what in problem.what)


def test_answer_must_be_one_whole_token(tiny_tokenizer) -> None:
    def ids(text: str) -> list[int]:
        return tiny_tokenizer(text)["input_ids"]

    assert answer_problem(tiny_tokenizer, PromptPair("x", "y", "7"), ids("7")) is None
    multi = answer_problem(tiny_tokenizer, PromptPair("x", "y", "12"), ids("12"))
    assert multi is not None and "more than one token" in multi.what and "'1', '2'" in multi.example
    space = answer_problem(tiny_tokenizer, PromptPair("3 + 5 =", "y", " 8"), ids(" 8"))
    assert space is not None and "a space" in space.what and "('3 + 5 = ')" in space.fix


def test_transfer_scores_first_tokens_and_needs_no_counterfactual(tiny_tokenizer) -> None:
    long_answer = PromptPair("9 + 9 = ", "9 @ 9 = ", "18", template_id="add-eq-0")
    with pytest.raises(DataError, match=r"^pair 1 \(template add-eq-0\): the answer is more than one token"):
        tokenize_pairs(tiny_tokenizer, [long_answer])
    batch, _ = tokenize_pairs(tiny_tokenizer, [long_answer], first_token_answers=True)
    assert batch.answer_ids.tolist() == [ord("1")]
    question = "Question: 2 apples and 3 more?\nAnswer: "
    word_problem = PromptPair(question, question, "5")
    with pytest.raises(DataError, match="the reference itself"):
        tokenize_pairs(tiny_tokenizer, [word_problem])
    batch, _ = tokenize_pairs(tiny_tokenizer, [word_problem], counterfactual_required=False)
    assert batch.answer_ids.tolist() == [ord("5")]
