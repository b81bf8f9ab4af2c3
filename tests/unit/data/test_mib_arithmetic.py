"""MIB's arithmetic prompts: format, equal token lengths, the scored-token rule."""

from __future__ import annotations

import pytest

from arithmech.data.mib_arithmetic import mib_pairs
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


def test_seeded_and_refuses_unknown_operations() -> None:
    tok = make_tiny_tokenizer()
    assert mib_pairs(tok, "addition", 5, seed=3) == mib_pairs(tok, "addition", 5, seed=3)
    assert mib_pairs(tok, "addition", 5, seed=3) != mib_pairs(tok, "addition", 5, seed=4)
    with pytest.raises(ConfigError, match="no MIB prompts"):
        mib_pairs(tok, "division", 5)
