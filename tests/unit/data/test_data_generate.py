"""Generation: deterministic by seed, correct answers, valid problems, few-shot prefix, operator-only swap."""

from __future__ import annotations

import random

import pytest

from arithmech.data import GenerationConfig, PromptPair, Template, generate_pairs, load_templates, solve
from arithmech.errors import ConfigError

OPS = {"addition": int.__add__, "subtraction": int.__sub__, "multiplication": int.__mul__}


def evaluate(operation: str, a: int, b: int) -> int:
    if operation == "division":
        assert b != 0 and a % b == 0, (a, b)
        return a // b
    return OPS[operation](a, b)


@pytest.fixture(scope="module")
def pairs() -> list[PromptPair]:
    return generate_pairs(GenerationConfig(n_per_template=8, seed=1))


def test_counts_and_metadata(pairs: list[PromptPair]) -> None:
    templates = load_templates()
    assert len(pairs) == 8 * len(templates)
    by_id = {t.id: t for t in templates}
    for p in pairs:
        t = by_id[p.template_id]
        assert (p.operation, p.formation) == (t.operation, t.formation)


def test_same_seed_same_list_other_seed_differs() -> None:
    cfg = GenerationConfig(n_per_template=5, seed=3)
    assert generate_pairs(cfg) == generate_pairs(cfg)
    assert generate_pairs(cfg) != generate_pairs(GenerationConfig(n_per_template=5, seed=4))


def test_does_not_touch_global_rng() -> None:
    random.seed(123)
    expected = random.random()
    random.seed(123)
    generate_pairs(GenerationConfig(n_per_template=3))
    assert random.random() == expected


def test_answers_are_correct_single_digits(pairs: list[PromptPair]) -> None:
    for p in pairs:
        value = evaluate(p.operation, int(p.a), int(p.b))
        assert p.answer == str(value)
        assert 0 <= value <= 9
        assert 0 <= int(p.a) <= 9 and 0 <= int(p.b) <= 9


def test_subtraction_non_negative_division_exact() -> None:
    cfg = GenerationConfig(
        operations=("subtraction", "division"), n_per_template=30, single_digit_answer=False, operand_max=30
    )
    for p in generate_pairs(cfg):
        a, b = int(p.a), int(p.b)
        if p.operation == "subtraction":
            assert a >= b
        else:
            assert b != 0 and a % b == 0
        assert p.answer == str(evaluate(p.operation, a, b))


@pytest.mark.parametrize("single", [True, False])
def test_large_ranges_use_valid_direct_sampling(single: bool) -> None:
    cfg = GenerationConfig(
        formations=("equation",),
        n_per_template=40,
        operand_min=0,
        operand_max=5000,
        single_digit_answer=single,
    )
    for p in generate_pairs(cfg):
        a, b = int(p.a), int(p.b)
        assert 0 <= a <= 5000 and 0 <= b <= 5000
        value = evaluate(p.operation, a, b)
        assert value >= 0 and p.answer == str(value)
        if single:
            assert value <= 9


def test_few_shot_prefix_holds_solved_examples_of_same_template(pairs: list[PromptPair]) -> None:
    by_id = {t.id: t for t in load_templates()}
    for p in pairs:
        t = by_id[p.template_id]
        lines = p.reference.split("\n")
        assert len(lines) == 4  # 3 examples + the final query
        for line in lines[:3]:
            example = _parse(t, line)
            assert example is not None, (t.id, line)
            a, b, answer = example
            assert answer == evaluate(t.operation, a, b)
            assert (str(a), str(b)) != (p.a, p.b)  # examples use other operands
        assert lines[3] == t.render(p.a, p.b).text
        assert p.span_text("prefix") == "\n".join(lines[:3]) + "\n"


def _parse(t: Template, line: str) -> tuple[int, int, int] | None:
    for a in range(10):
        for b in range(10):
            head = t.render(str(a), str(b)).text
            if line.startswith(head) and line[len(head) :].isdigit():
                return a, b, int(line[len(head) :])
    return None


def test_zero_shot_has_empty_prefix() -> None:
    for p in generate_pairs(GenerationConfig(n_per_template=2, few_shot=0)):
        assert "\n" not in p.reference and p.spans["prefix"] == (0, 0)


def test_counterfactual_differs_only_in_final_operator(pairs: list[PromptPair]) -> None:
    by_id = {t.id: t for t in load_templates()}
    for p in pairs:
        t = by_id[p.template_id]
        start, end = p.spans["operator"]
        assert p.reference[start:end] == t.operator
        assert p.counterfactual == p.reference[:start] + t.counterfactual_operator + p.reference[end:]


def test_spans_point_at_operands(pairs: list[PromptPair]) -> None:
    for p in pairs:
        assert p.span_text("A") == p.a and p.span_text("B") == p.b
        assert p.spans["prefix"][1] <= min(p.spans[k][0] for k in ("A", "B", "operator"))


def test_filters_and_template_ids() -> None:
    cfg = GenerationConfig(operations=["division"], formations=["qa"], n_per_template=2)
    assert cfg.operations == ("division",)
    got = generate_pairs(cfg)
    assert got and all(p.operation == "division" and p.formation == "qa" for p in got)
    got = generate_pairs(GenerationConfig(template_ids=("mul-eq-2",), n_per_template=3))
    assert {p.template_id for p in got} == {"mul-eq-2"}


def test_custom_templates_argument() -> None:
    t = Template("x", "addition", "equation", "{A} plus {B} makes ", "plus", "nothing")
    got = generate_pairs(GenerationConfig(n_per_template=2, few_shot=1), templates=[t])
    assert len(got) == 2 and got[0].counterfactual.endswith(" nothing " + got[0].b + " makes ")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"operations": ("modulo",)}, "operations must be"),
        ({"formations": ()}, "formations must be"),
        ({"template_ids": ()}, "template_ids must be"),
        ({"n_per_template": 0}, "n_per_template must be >= 1"),
        ({"operand_min": -1}, "operand_min must be >= 0"),
        ({"operand_min": 5, "operand_max": 2}, "set operand_max >= operand_min"),
        ({"few_shot": -1}, "few_shot must be >= 0"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"n_per_template": True}, "n_per_template must be an integer"),
        ({"single_digit_answer": "yes"}, "single_digit_answer must be true or false"),
    ],
)
def test_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GenerationConfig(**kwargs)


def test_range_without_valid_problem_raises() -> None:
    with pytest.raises(ConfigError, match="admit no valid addition problem with a single-digit answer"):
        generate_pairs(GenerationConfig(operations=("addition",), operand_min=5, operand_max=9))
    with pytest.raises(ConfigError, match="admit no valid multiplication problem"):
        generate_pairs(GenerationConfig(operations=("multiplication",), operand_min=300, operand_max=900))
    with pytest.raises(ConfigError, match="admit no valid division problem"):
        generate_pairs(GenerationConfig(operations=("division",), operand_min=0, operand_max=0))


def test_unknown_template_id_and_empty_selection() -> None:
    with pytest.raises(ConfigError, match="not among the templates"):
        generate_pairs(GenerationConfig(template_ids=("nope",)))
    with pytest.raises(ConfigError, match="no template matches"):
        generate_pairs(GenerationConfig(operations=("addition",), template_ids=("div-eq-1",)))


def test_tiny_range_still_fills_few_shot() -> None:
    got = generate_pairs(
        GenerationConfig(operations=("division",), formations=("equation",), operand_min=0, operand_max=1)
    )
    assert got and all(p.reference.count("\n") == 3 for p in got)


def test_solve() -> None:
    assert (
        solve("subtraction", 2, 3) is None
        and solve("division", 3, 0) is None
        and solve("division", 7, 2) is None
    )
    assert solve("division", 8, 2) == 4
    with pytest.raises(ConfigError):
        solve("power", 1, 2)
