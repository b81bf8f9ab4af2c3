"""MIB's arithmetic prompts: format, equal token lengths, the scored-token rule."""

from __future__ import annotations

import itertools

import pytest

from arithmech.data.mib_arithmetic import mib_pairs, mib_prompt_stream, widest_prompt_tokens
from arithmech.data.mib_facts import distinct_prompts, fact, fact_part
from arithmech.errors import ConfigError

from tiny_models import make_multidigit_tokenizer, make_tiny_tokenizer


@pytest.mark.parametrize("operation", ["addition", "subtraction"])
def test_pairs_follow_mibs_template(operation: str) -> None:
    tok = make_tiny_tokenizer()
    pairs = mib_pairs(tok, operation, 20, seed=1)
    assert len(pairs) == 20
    word = "plus" if operation == "addition" else "minus"
    for p in pairs:
        assert p.reference.startswith("Q: How much is ") and f" {word} " in p.reference
        assert p.reference.endswith("? A: ")  # the split-off space stays in the prompt (digit tokenizer)
        a, b, c = int(p.a), int(p.b), int(p.answer)  # type: ignore[arg-type]
        assert c == (a + b if operation == "addition" else a - b) and c >= 0
        assert len(tok(p.reference)["input_ids"]) == len(tok(p.counterfactual)["input_ids"])
        assert tok.decode([p.extra["answer_id"]]) == p.answer[0]  # digit tokenizer: the leading digit
        assert tok.decode([p.extra["cf_answer_id"]]) == p.extra["cf_answer"][0]
        assert p.extra["answer_id"] != p.extra["cf_answer_id"]
        assert p.reference != p.counterfactual


def test_number_tokens_are_scored_whole() -> None:
    tok = make_multidigit_tokenizer()  # 0..99 are single tokens
    for p in mib_pairs(tok, "addition", 10, max_operand=40):
        assert tok.decode([p.extra["answer_id"]]) == p.answer[:2]


@pytest.mark.parametrize("make", [make_tiny_tokenizer, make_multidigit_tokenizer])
@pytest.mark.parametrize("operation", ["addition", "subtraction"])
def test_the_widest_prompt_bounds_every_prompt_drawn(make: object, operation: str) -> None:
    """The memory budget plans the circuit stage at `widest_prompt_tokens`: no prompt the stream draws is wider, and
    with enough drawn one is as wide (a digit tokenizer: 2-digit operands; one whose numbers are single tokens)."""
    tok = make()  # type: ignore[operator]
    drawn = [len(tok(p.text)["input_ids"]) for p in itertools.islice(mib_prompt_stream(tok, operation), 2000)]
    assert max(drawn) == widest_prompt_tokens(tok, operation)
    assert widest_prompt_tokens(tok, operation, max_operand=9) < widest_prompt_tokens(tok, operation) or (
        make is make_multidigit_tokenizer)  # fmt: skip


def test_seeded_and_refuses_unknown_operations() -> None:
    tok = make_tiny_tokenizer()
    assert mib_pairs(tok, "addition", 5, seed=3) == mib_pairs(tok, "addition", 5, seed=3)
    assert mib_pairs(tok, "addition", 5, seed=3) != mib_pairs(tok, "addition", 5, seed=4)
    with pytest.raises(ConfigError, match="no MIB prompts"):
        mib_pairs(tok, "division", 5)


def _facts(pairs, operation: str) -> set[tuple[int, int]]:
    """The facts of every clean and counterfactual prompt of `pairs`."""
    return {fact(operation, int(a), int(b)) for p in pairs
            for a, b in ((p.a, p.b), (p.extra["cf_a"], p.extra["cf_b"]))}  # fmt: skip


def test_a_fact_is_one_triple_read_four_ways() -> None:
    assert fact("addition", 3, 4) == fact("addition", 4, 3) == fact("subtraction", 7, 3) == fact("subtraction", 7, 4)
    assert fact("addition", 3, 5) != fact("addition", 3, 4)
    for seed in (0, 1):
        parts = {fact_part(op, a, b, seed) for op, a, b in (("addition", 3, 4), ("addition", 4, 3),
                                                             ("subtraction", 7, 3), ("subtraction", 7, 4))}  # fmt: skip
        assert len(parts) == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_find_and_test_parts_share_no_prompt_and_no_fact(seed: int) -> None:
    """Small operands (0..9: 55 facts) so that a shared fact would show; addition and subtraction pooled."""
    tok = make_tiny_tokenizer()
    parts = {part: {op: mib_pairs(tok, op, 30, seed=seed, max_operand=9, part=part)
                    for op in ("addition", "subtraction")} for part in ("find", "test")}  # fmt: skip
    facts = {part: set().union(*(_facts(pairs, op) for op, pairs in by_op.items())) for part, by_op in parts.items()}
    texts = {part: {t for pairs in by_op.values() for p in pairs for t in (p.reference, p.counterfactual)}
             for part, by_op in parts.items()}  # fmt: skip
    assert all(len(pairs) == 30 for by_op in parts.values() for pairs in by_op.values())
    assert not facts["find"] & facts["test"] and not texts["find"] & texts["test"]
    assert len(facts["find"]) >= 10 and len(facts["test"]) >= 10
    shares = [fact_part("addition", a, b, seed) for a in range(100) for b in range(a, 100)]
    assert 0.4 < shares.count("test") / len(shares) < 0.6  # about half the facts each
    everything = _facts(mib_pairs(tok, "addition", 60, seed=seed, max_operand=9), "addition")
    assert everything & facts["find"] and everything & facts["test"]  # part=None draws from both


def test_the_split_changes_with_the_seed() -> None:
    parts = [[fact_part("addition", a, b, seed) for a in range(20) for b in range(a, 20)] for seed in (0, 1)]
    assert parts[0] != parts[1]


@pytest.mark.parametrize("operation", ["addition", "subtraction"])
def test_distinct_prompts_counts_what_the_stream_can_give(operation: str) -> None:
    """Issue 34.4: the generator's supply, counted without a tokenizer, equals the prompts its stream gives."""
    tok = make_tiny_tokenizer()
    for part in ("find", "test", None):
        stream = mib_prompt_stream(tok, operation, seed=3, max_operand=9, part=part)
        seen = {(p.a, p.b) for p in itertools.islice(stream, 3000)}
        assert len(seen) == distinct_prompts(operation, 9, 3, part), part
    assert distinct_prompts(operation, 999, 0, "find") == distinct_prompts(operation, 999, 0, None) // 2  # estimated
