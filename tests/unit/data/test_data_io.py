"""Prompt files: lossless JSONL round trip, and one clear DataError per malformed file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arithmech.data import GenerationConfig, PromptPair, generate_pairs, read_prompt_file, write_prompt_file
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
        ("not json\n", "line 1 is not JSON, so the file is not JSONL"),
        ("[1, 2]\n", "line 1 is a JSON list, not an object"),
        ('{"reference": "x"}\n', "line 1 is missing the field(s) counterfactual, answer"),
        ('{"reference": "x", "counterfactual": "y", "answer": ""}\n', "line 1 has an empty answer"),
        ('{"reference": "", "counterfactual": "y", "answer": "1"}\n', "line 1 has an empty reference"),
        ('{"reference": 5, "counterfactual": "y", "answer": "1"}\n', "line 1 has a non-string reference"),
        ('{"reference": "x", "counterfactual": "y", "answer": true}\n', "non-string answer"),
        (
            '{"reference": "x", "counterfactual": "y", "answer": "1", "template_id": 3}\n',
            "non-string template_id",
        ),
        (
            '{"reference": "x", "counterfactual": "y", "answer": "1", "spans": {"A": [0, 9]}}\n',
            "invalid span A",
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
    with pytest.raises(DataError, match="line 4 is not JSON"):
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
