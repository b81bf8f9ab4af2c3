"""Templates: the shipped set is complete and balanced; malformed ones fail with one clear sentence."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from arithmech.data import FORMATIONS, OPERATIONS, Template, load_templates, select_templates
from arithmech.errors import DataError

GOOD = {
    "id": "add-eq-x",
    "operation": "addition",
    "formation": "equation",
    "text": "{A} + {B} = ",
    "operator": "+",
    "counterfactual_operator": "@",
}


def write(tmp_path: Path, rows: object) -> Path:
    path = tmp_path / "templates.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def test_builtin_templates_are_many_and_balanced() -> None:
    templates = load_templates()
    assert len(templates) >= 36
    cells = Counter((t.operation, t.formation) for t in templates)
    for operation in OPERATIONS:
        for formation in FORMATIONS:
            assert cells[(operation, formation)] >= 3, (operation, formation)
    assert len({t.id for t in templates}) == len(templates)


def test_builtin_templates_end_with_one_space_and_hold_their_operator() -> None:
    for t in load_templates():
        assert t.text.endswith(" ") and not t.text.endswith("  ")
        assert t.operator in t.text and t.counterfactual_operator != t.operator


def test_render_spans_point_at_operands_and_operator() -> None:
    for t in load_templates():
        for cf in (False, True):
            rendered = t.render("7", "2", counterfactual=cf)
            text = rendered.text
            assert text[slice(*rendered.spans["A"])] == "7"
            assert text[slice(*rendered.spans["B"])] == "2"
            op = t.counterfactual_operator if cf else t.operator
            assert text[slice(*rendered.spans["operator"])] == op


def test_render_handles_b_before_a() -> None:
    t = Template("s", "subtraction", "statement", "Take {B} from {A}, get ", "Take", "Paint")
    r = t.render("9", "4")
    assert r.text == "Take 4 from 9, get "
    assert r.spans == {"operator": (0, 4), "B": (5, 6), "A": (12, 13)}


def test_load_accepts_plain_list(tmp_path: Path) -> None:
    assert load_templates(write(tmp_path, [GOOD])) == [Template(**GOOD)]


def test_select_templates_filters() -> None:
    templates = load_templates()
    chosen = select_templates(templates, ("division",), ("qa",), None)
    assert chosen and all(t.operation == "division" and t.formation == "qa" for t in chosen)
    assert [t.id for t in select_templates(templates, template_ids=("add-eq-1",))] == ["add-eq-1"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"text": "{A} + = "}, "has no {B} slot; put {A} and {B}"),
        ({"text": "+ {B} = "}, "has no {A} slot"),
        ({"text": "{A} + {B} {B} = "}, "has 2 {B} slots"),
        ({"operator": "plus"}, "operator 'plus' that is not in its text"),
        ({"text": "{A} + {B} + "}, "does not occur exactly once"),
        ({"operation": "modulo"}, "unknown operation 'modulo'; use one of addition"),
        ({"formation": "poem"}, "unknown formation 'poem'"),
        ({"text": "{A} + {B} ="}, "does not end with exactly one space"),
        ({"counterfactual_operator": "+"}, "equal to its operator"),
        ({"operator": ""}, "empty or non-string 'operator'"),
        ({"operator": 3}, "empty or non-string 'operator'"),
    ],
)
def test_malformed_template_raises_clear_error(tmp_path: Path, change: dict, expected: str) -> None:
    path = write(tmp_path, {"templates": [{**GOOD, **change}]})
    with pytest.raises(DataError, match="template 'add-eq-x'") as info:
        load_templates(path)
    assert expected in str(info.value)


def test_operator_inside_slot_does_not_count(tmp_path: Path) -> None:
    path = write(tmp_path, [{**GOOD, "operator": "A", "counterfactual_operator": "Z"}])
    with pytest.raises(DataError, match="does not occur exactly once outside the slots"):
        load_templates(path)


def test_missing_fields_are_named(tmp_path: Path) -> None:
    row = {k: v for k, v in GOOD.items() if k not in ("operator", "formation")}
    with pytest.raises(DataError, match="missing formation, operator"):
        load_templates(write(tmp_path, [row]))


def test_duplicate_id(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="'add-eq-x' is used twice"):
        load_templates(write(tmp_path, [GOOD, GOOD]))


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"templates": 3}', "[5]"])
def test_bad_files(tmp_path: Path, content: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError):
        load_templates(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_templates(tmp_path / "nope.json")
