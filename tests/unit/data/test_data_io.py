"""Prompt files: lossless JSONL round trip, and one clear DataError per malformed file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arithmech.data import (
    GenerationConfig,
    PromptPair,
    default_templates_path,
    generate_pairs,
    load_templates,
    read_prompt_file,
    write_prompt_file,
)
from arithmech.data.locate import read_data_text
from arithmech.data.mediation_prompts import load_facts
from arithmech.errors import DataError


def test_round_trip_generated(tmp_path: Path) -> None:
    pairs = generate_pairs(GenerationConfig(n_per_template=2, seed=5))
    path = tmp_path / "sub" / "pairs.jsonl"
    write_prompt_file(path, pairs)
    assert read_prompt_file(path) == pairs
    assert [p.name for p in path.parent.iterdir()] == ["pairs.jsonl"]  # no temporary left behind


def test_round_trip_custom_with_extra(tmp_path: Path) -> None:
    pairs = [
        PromptPair("7 × 8 = ", "7 § 8 = ", "56", extra={"source": "mine", "difficulty": 2, "tags": ["x"]}),
        PromptPair("a\nb", "a\nc", "3", template_id="t", a="1", b="2", spans={"A": (0, 1)}),
    ]
    path = tmp_path / "p.jsonl"
    write_prompt_file(path, pairs)
    assert read_prompt_file(path) == pairs
    assert "×" in path.read_text(encoding="utf-8")


def test_minimal_rows_numbers_and_extras(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [
        {"reference": "3 + 5 = ", "counterfactual": "3 @ 5 = ", "answer": 8, "note": "hi"},
        {
            "reference": "1 + 1 = ",
            "counterfactual": "1 @ 1 = ",
            "answer": "2",
            "operation": "addition",
            "a": 1,
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    first, second = read_prompt_file(path)
    assert first.answer == "8" and first.extra == {"note": "hi"} and first.template_id is None
    assert second.operation == "addition" and second.a == "1" and second.b is None and second.spans == {}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "has no rows"),
        ("\n  \n", "has no rows"),
        ("not json\n", "line 1: not JSON, so the file is not JSONL"),
        ("[1, 2]\n", "line 1: a JSON value that is not an object (a list)"),
        ('{"reference": "x"}\n', "line 1: missing required fields (no counterfactual, answer)"),
        ('{"reference": "x", "counterfactual": "y", "answer": ""}\n', "line 1: an empty answer"),
        ('{"reference": "", "counterfactual": "y", "answer": "1"}\n', "line 1: an empty reference"),
        ('{"reference": 5, "counterfactual": "y", "answer": "1"}\n', "line 1: a non-string reference"),
        ('{"reference": "x", "counterfactual": "y", "answer": true}\n', "non-string answer"),
        (
            '{"reference": "x", "counterfactual": "y", "answer": "1", "template_id": 3}\n',
            "non-string template_id",
        ),
        (
            '{"reference": "x", "counterfactual": "y", "answer": "1", "spans": {"A": [0, 9]}}\n',
            "an invalid span (A=[0, 9])",
        ),
        (
            '{"reference": "x", "counterfactual": "y", "answer": "1", "spans": [1]}\n',
            "spans that are not an object",
        ),
    ],
)
def test_bad_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_prompt_file(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_error_names_the_right_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"reference": "x", "counterfactual": "y", "answer": "1"})
    path.write_text(f"{good}\n\n{good}\n{{broken\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 4 \(1 of 3 lines\): not JSON"):
        read_prompt_file(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        read_prompt_file(tmp_path / "none.jsonl")


def test_write_rejects_clashing_or_unserialisable_extra(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="clash with built-in fields"):
        write_prompt_file(tmp_path / "a.jsonl", [PromptPair("x", "y", "1", extra={"answer": "2"})])
    with pytest.raises(DataError, match="JSON cannot hold"):
        write_prompt_file(tmp_path / "b.jsonl", [PromptPair("x", "y", "1", extra={"obj": object()})])
    assert not (tmp_path / "a.jsonl").exists() and not (tmp_path / "b.jsonl").exists()


def test_files_saved_with_a_byte_order_mark_are_read(tmp_path: Path) -> None:
    """Windows editors save "UTF-8 with BOM"; prompt, template, word-problem and mediation files all read it."""
    bom = b"\xef\xbb\xbf"
    prompts = tmp_path / "p.jsonl"
    row = {"reference": "3 + 5 = ", "counterfactual": "3 @ 5 = ", "answer": "8"}
    prompts.write_bytes(bom + json.dumps(row).encode())
    assert read_prompt_file(prompts) == [PromptPair("3 + 5 = ", "3 @ 5 = ", "8")]
    templates = tmp_path / "t.json"
    templates.write_bytes(bom + default_templates_path().read_bytes())
    assert load_templates(templates) == load_templates()
    problems = tmp_path / "w.jsonl"
    problems.write_bytes(bom + b'{"question": "1 and 2?", "answer": "3"}\n')
    assert json.loads(read_data_text(problems).splitlines()[0])["answer"] == "3"
    facts = tmp_path / "facts.json"
    facts.write_bytes(bom + json.dumps({"relations": []}).encode())
    assert load_facts(facts) == []


def test_a_line_separator_inside_a_prompt_survives(tmp_path: Path) -> None:
    pairs = [PromptPair("Q:\u2028 3 + 5 = ", "Q:\u2028 3 @ 5 = ", "8"), PromptPair("1 + 1 = ", "1 @ 1 = ", "2")]
    write_prompt_file(tmp_path / "p.jsonl", pairs)  # written unescaped (ensure_ascii=False)
    assert read_prompt_file(tmp_path / "p.jsonl") == pairs
    assert [p.line for p in read_prompt_file(tmp_path / "p.jsonl")] == [1, 2]
