"""Held-out prompts (data/heldout.py) and the generation they rest on: queries among accepted problems only, facts
shared with no ranked prompt, the run's templates, and a reason (not an error) when nothing is left."""

from __future__ import annotations

import re

from arithmech.data import GenerationConfig, PromptPair, generate_pairs, write_prompt_file
from arithmech.data.facts import pair_fact
from arithmech.data.heldout import fresh_candidates, reference_config
from arithmech.data.reference_config import ReferenceSetConfig, reference_pairs
from arithmech.data.sampling import stratified_sample


def _addition_fact(pair: PromptPair) -> tuple[int, int, int]:
    """An addition query's fact worked out here: the sum and the sorted operands (3 + 5 is 5 + 3)."""
    assert pair.operation == "addition" and pair.a is not None and pair.b is not None
    a, b = int(pair.a), int(pair.b)
    return a + b, min(a, b), max(a, b)


def _example_operands(pair: PromptPair) -> list[tuple[int, int]]:
    """The operands of the solved examples in a prompt's prefix of "3 + 5 = 8" or "3+5 = 8" lines."""
    return [(int(a), int(b)) for a, b in re.findall(r"(\d+) ?\+ ?(\d+) = \d+\n", pair.span_text("prefix"))]


def test_keep_restricts_the_queries_and_not_the_examples() -> None:
    cfg = GenerationConfig(template_ids=("add-eq-1", "add-eq-2"), n_per_template=16, seed=0)  # "3 + 5 = ", "3+5 = "
    assert generate_pairs(cfg) == generate_pairs(cfg, keep=None)  # no keep: the same list as before
    kept = generate_pairs(cfg, keep=lambda op, ab: sum(ab) >= 5)
    assert len(kept) == len(generate_pairs(cfg)) and all(int(p.a) + int(p.b) >= 5 for p in kept)  # type: ignore[arg-type]
    examples = [ab for p in kept for ab in _example_operands(p)]
    assert len(examples) == 3 * len(kept)
    assert any(sum(ab) < 5 for ab in examples)  # examples come from every valid problem


def test_a_template_with_no_accepted_problem_gives_no_pairs() -> None:
    cfg = GenerationConfig(operations=("addition", "subtraction"), formations=("equation",), n_per_template=2)
    pairs = generate_pairs(cfg, keep=lambda op, _: op == "addition")
    assert pairs and {p.operation for p in pairs} == {"addition"}


def test_keep_on_a_sampled_range() -> None:
    """Operand ranges above 200 values are sampled, not enumerated: the redraw keeps to `keep` too."""
    cfg = GenerationConfig(operations=("addition",), formations=("equation",), n_per_template=8, operand_min=0,
                           operand_max=999, single_digit_answer=False)  # fmt: skip
    pairs = generate_pairs(cfg, keep=lambda _, ab: ab[0] % 2 == 0)
    assert len(pairs) == 32 and all(int(p.a) % 2 == 0 for p in pairs)  # type: ignore[arg-type]
    assert any(int(p.a) % 2 for p in generate_pairs(cfg))  # (which the unrestricted draws are not)
    assert generate_pairs(cfg, keep=lambda _, ab: False) == []


def test_pair_fact_joins_swaps_and_inverses() -> None:
    def pair(op: str, a: str, b: str) -> PromptPair:
        return PromptPair("q", "c", "1", operation=op, a=a, b=b)

    assert pair_fact(pair("addition", "3", "5")) == pair_fact(pair("addition", "5", "3"))
    assert pair_fact(pair("subtraction", "7", "2")) == pair_fact(pair("subtraction", "7", "5"))
    assert pair_fact(pair("subtraction", "7", "2")) == pair_fact(pair("addition", "2", "5"))  # 2 + 5 = 7
    assert pair_fact(pair("addition", "3", "5")) != pair_fact(pair("addition", "2", "6"))  # same sum, other fact
    assert pair_fact(pair("multiplication", "2", "4")) == pair_fact(pair("division", "8", "4"))
    assert pair_fact(pair("addition", "1.5", "2")) is None  # decimals: no fact of data/facts.py
    assert pair_fact(pair("subtraction", "2", "7")) is None  # not a problem (negative)
    assert pair_fact(PromptPair("q", "c", "1")) is None  # a user's prompt without operands


def test_fresh_candidates_share_no_prompt_and_no_fact() -> None:
    cfg = ReferenceSetConfig()  # identify's defaults: 12 addition templates x 16 prompts, operands 0-9
    pairs = reference_pairs(cfg)
    ranked = [pairs[i] for i in stratified_sample(pairs, 32, seed=0)]
    fresh, record = fresh_candidates(cfg, ranked)
    ranked_facts = {_addition_fact(p) for p in ranked}
    assert len(fresh) == len(pairs) and "why_none" not in record  # as many as identify made, all fresh
    assert {_addition_fact(p) for p in fresh}.isdisjoint(ranked_facts)
    assert {p.reference for p in fresh}.isdisjoint(p.reference for p in ranked)
    assert {p.template_id for p in fresh} == {p.template_id for p in pairs}
    assert record["ranked"] == {"prompts": 32, "facts": len(ranked_facts), "without_fact": 0}
    assert record["candidates"] == {"made": len(pairs), "fresh": len(pairs)}
    left = [p for p in pairs if p not in ranked]  # the leftovers would not do: most state a ranked fact
    assert sum(_addition_fact(p) in ranked_facts for p in left) > len(left) / 2


def test_a_prompts_file_gives_its_own_other_prompts(tmp_path) -> None:
    pairs = reference_pairs(ReferenceSetConfig(formations=("equation",), n_per_template=4))
    ranked = pairs[:4]
    write_prompt_file(tmp_path / "p.jsonl", pairs)
    fresh, record = fresh_candidates(ReferenceSetConfig(prompts_file=str(tmp_path / "p.jsonl")), ranked)
    facts = {_addition_fact(p) for p in ranked}
    assert fresh == [p for p in pairs[4:] if _addition_fact(p) not in facts]
    assert 0 < len(fresh) < len(pairs) - 4 and record["source"].startswith("the prompts file")


def test_no_fresh_fact_left_is_a_reason_not_an_error() -> None:
    cfg = ReferenceSetConfig(operand_max=1, formations=("equation",), n_per_template=8)
    pairs = reference_pairs(cfg)  # 0 + 0, 0 + 1, 1 + 0, 1 + 1: three facts, every one drawn
    fresh, record = fresh_candidates(cfg, pairs)
    assert fresh == [] and "every candidate prompt states one of the 3 ranked facts" in record["why_none"]


def test_reference_config_of_a_recorded_identify_config() -> None:
    recorded = {"operations": ["addition"], "formations": ["qa"], "few_shot": 2, "method": "exact", "top_k": 10}
    assert reference_config(recorded) == ReferenceSetConfig(operations=("addition",), formations=("qa",), few_shot=2)
