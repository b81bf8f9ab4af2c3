"""The arithmetic train / validation / test split is leakage-free (over seeds), deterministic and recorded."""

from __future__ import annotations

import json

import pytest

from arithmech.data.arithmetic_split import (
    TRANSFER_MIN,
    make_split,
    split_prompts,
    transfer_prompts,
)
from arithmech.data.generate import solve
from arithmech.data.prompts import PromptPair
from arithmech.data.templates import OPERATIONS, load_templates
from arithmech.errors import ConfigError


def pairs_in(prompt: PromptPair) -> set[tuple[int, int]]:
    """Every operand pair written in a prompt: its query and its solved examples."""
    assert prompt.a is not None and prompt.b is not None
    return {(int(prompt.a), int(prompt.b))} | {(a, b) for a, b in prompt.extra["examples"]}


def query(prompt: PromptPair) -> tuple[int, int]:
    return int(str(prompt.a)), int(str(prompt.b))


@pytest.mark.parametrize("seed", range(12))
def test_no_test_prompt_shares_a_template_or_an_operand_pair_with_training(seed: int) -> None:
    split = make_split(seed)
    train = split_prompts(split, "train", n=2000, seed=seed)  # several passes: many different solved examples
    validation = split_prompts(split, "validation", seed=seed)
    test = split_prompts(split, "test", seed=seed)
    train_templates = {p.template_id for p in train}
    train_pairs = set().union(*(pairs_in(p) for p in train))
    assert train_templates == set(split.train_templates)
    assert train_pairs <= set(split.pairs["train"])
    for p in test:
        assert p.template_id not in train_templates
        assert query(p) not in train_pairs and query(p) in split.pairs["test"]
        assert pairs_in(p) - {query(p)} <= set(split.pairs["train"])  # solved examples: train pairs only
    for p in validation:
        assert p.template_id in train_templates and query(p) not in train_pairs
    # a held-out pair is written (with its answer) only as the query of its own part, never as a solved example
    examples = {tuple(e) for p in [*train, *validation, *test] for e in p.extra["examples"]}
    assert not examples & (set(split.pairs["test"]) | set(split.pairs["validation"]))
    # every part asks single-digit-answer problems, and every (template, pair) of test is asked once
    assert all(p.answer == str(solve(str(p.operation), *query(p))) and len(p.answer) == 1 for p in test)
    asked = [(p.template_id, query(p)) for p in test]
    assert len(asked) == len(set(asked)) == sum(
        len(split.valid_pairs("test", t.operation)) for t in load_templates() if t.id in split.test_templates
    )


def test_split_covers_every_group_and_is_deterministic() -> None:
    a, b = make_split(3), make_split(3)
    assert a == b and a.fingerprint == b.fingerprint and a.fingerprint != make_split(4).fingerprint
    grid = {(x, y) for x in range(10) for y in range(10)}
    parts = [set(a.pairs[p]) for p in ("train", "validation", "test")]
    assert set.union(*parts) == grid and sum(len(p) for p in parts) == len(grid)  # a partition of the grid
    templates = load_templates()
    for t in templates:  # every (operation, formation) keeps 2 train and 2 test templates
        group = [u.id for u in templates if (u.operation, u.formation) == (t.operation, t.formation)]
        assert sum(g in a.test_templates for g in group) == 2 and sum(g in a.train_templates for g in group) == 2
    for op in OPERATIONS:  # held out in proportion: 40% / 20% of each operation's problems, to within rounding
        counts = {part: len(a.valid_pairs(part, op)) for part in ("train", "validation", "test")}
        total = sum(counts.values())
        assert abs(counts["test"] - 0.4 * total) <= 3 and abs(counts["validation"] - 0.2 * total) <= 3, (op, counts)
    record = a.record()
    assert json.loads(json.dumps(record)) == record and record["fingerprint"] == a.fingerprint
    assert [p.reference for p in split_prompts(a, "test")] == [p.reference for p in split_prompts(b, "test")]


def test_a_prompt_does_not_depend_on_which_others_are_generated() -> None:
    split = make_split(0)
    alone = split_prompts(split, "test", ("subtraction",))
    together = [p for p in split_prompts(split, "test") if p.operation == "subtraction"]
    assert sorted(p.reference for p in alone) == sorted(p.reference for p in together)


def test_transfer_set_is_held_out_multidigit_on_test_templates() -> None:
    split = make_split(0)
    prompts = transfer_prompts(split, ("addition", "subtraction"), n_per_template=4)
    ops = ("addition", "subtraction")
    held_out = [t for t in load_templates() if t.operation in ops and t.id in split.test_templates]
    assert len(held_out) == 12 and len(prompts) == 4 * len(held_out)  # 2 of 4 templates x 3 formations x 2 ops
    assert {p.template_id for p in prompts} <= set(split.test_templates)
    assert all(min(query(p)) >= TRANSFER_MIN for p in prompts)
    assert any(len(p.answer) > 1 for p in prompts)


def test_bad_split_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="hold out 1 to 3"):
        make_split(test_templates_per_group=4)
    with pytest.raises(ConfigError, match="shares of the operand grid"):
        make_split(test_fraction=0.7, validation_fraction=0.3)
    with pytest.raises(ConfigError, match="below the multi-digit"):
        make_split(operand_max=12)
    with pytest.raises(ConfigError, match="not one of"):
        split_prompts(make_split(), "dev")
    with pytest.raises(ConfigError, match="too few"):
        split_prompts(make_split(), "test", ("division",), few_shot=20)
