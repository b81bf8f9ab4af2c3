"""Transfer target sets: names, decimals and multi-digit generation, and the word-problem loader."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from arithmech.data import answer_token_id, locate, solve, tokenize_pairs
from arithmech.data import target_sets as ts
from arithmech.data.target_sets import (
    TargetOptions,
    TargetSpec,
    build_target_pairs,
    read_word_problems,
    register_target_set,
    resolve_word_problems,
    target_set,
    target_set_names,
)
from arithmech.errors import ConfigError, DataError

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
needs_shared = pytest.mark.skipif(not (SHARED / "svamp" / "test.jsonl").is_file(), reason="no ../shared/data")


def only_folder(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """The data lookup sees `folder` in place of the shipped copy, and no $ARITHMECH_DATA."""
    monkeypatch.delenv(locate.DATA_ENV, raising=False)
    monkeypatch.setattr(locate, "SHIPPED_DATA", folder)


def test_names_cover_operations_formations_and_word_problems() -> None:
    names = target_set_names()
    for name in ("addition", "division-qa", "multidigit-multiplication", "decimals-subtraction", "svamp", "gsm8k"):
        assert name in names
    assert len(names) == len(set(names))
    assert target_set("addition-qa").formations == ("qa",)
    assert target_set("my/problems.jsonl").kind == "word"
    with pytest.raises(ConfigError, match="unknown target set 'decimals-division'"):
        target_set("decimals-division")
    with pytest.raises(ConfigError, match="already registered"):
        register_target_set(TargetSpec("svamp", "word", "again", source="svamp"))


@pytest.mark.parametrize("operation", ["addition", "subtraction"])
def test_decimals_are_solved_and_target_the_first_digit(operation: str, tiny_tokenizer) -> None:
    pairs = build_target_pairs(target_set(f"decimals-{operation}"), TargetOptions(n_per_template=3, seed=2))
    assert len(pairs) == 3 * 4 * 3  # 3 per template, 4 templates in each of 3 formations
    sign = 1 if operation == "addition" else -1
    for p in pairs:
        a, b, c = Decimal(p.a), Decimal(p.b), Decimal(p.answer)
        assert c == a + sign * b and Decimal("0") < c < Decimal("10")
        assert all(len(x.split(".")[1]) == 1 and not x.endswith(".0") for x in (p.a, p.b))
        assert p.answer.count(".") == 1 and len(p.answer) == 3  # "4.2", also "4.0"
        for line in p.reference.splitlines()[:-1]:  # the solved examples are right too
            x, y, z = (Decimal(v) for v in re.findall(r"\d+\.\d", line))  # some templates put B first
            assert z == (x + y if sign == 1 else abs(x - y))
        assert p.span_text("A") == p.a and p.span_text("B") == p.b
        # only the operator differs between reference and counterfactual
        start, end = p.spans["operator"]
        assert p.reference[:start] == p.counterfactual[:start]
        assert p.counterfactual.endswith(p.reference[end:])
    t, _ = tokenize_pairs(tiny_tokenizer, pairs, first_token_answers=True)  # as transfer scores them
    for pair, answer in zip(t.pairs, t.answer_ids.tolist(), strict=True):
        assert answer == answer_token_id(tiny_tokenizer, pair.reference, pair.answer) == ord(pair.answer[0])


def test_decimals_same_seed_same_pairs() -> None:
    options = TargetOptions(n_per_template=2, seed=5)
    spec = target_set("decimals-addition")
    assert build_target_pairs(spec, options) == build_target_pairs(spec, options)


def test_multidigit_operands_and_answers() -> None:
    pairs = build_target_pairs(target_set("multidigit-addition"), TargetOptions(n_per_template=4))
    assert all(10 <= int(p.a) <= 99 and 10 <= int(p.b) <= 99 for p in pairs)
    assert all(int(p.answer) == solve("addition", int(p.a), int(p.b)) for p in pairs)
    assert any(len(p.answer) == 3 for p in pairs) and any(len(p.answer) == 2 for p in pairs)
    division = build_target_pairs(target_set("multidigit-division-equation"), TargetOptions(n_per_template=4))
    assert all(int(p.a) == int(p.b) * int(p.answer) for p in division)


@needs_shared
def test_svamp_prompts_are_three_shot_from_other_rows() -> None:
    options = TargetOptions(limit=4, seed=0, data_dir=str(SHARED))
    pairs = build_target_pairs(target_set("svamp"), options)
    assert len(pairs) == 4 and pairs == build_target_pairs(target_set("svamp"), options)
    rows = {r.id: r for r in read_word_problems(SHARED / "svamp" / "test.jsonl")}
    prefix = pairs[0].reference[: pairs[0].spans["prefix"][1]]
    assert all(p.reference.startswith(prefix) for p in pairs)  # one shared set of solved examples
    assert prefix.count("Question: ") == 3 and prefix.count("\nAnswer: ") == 3 and prefix.endswith("\n\n")
    for p in pairs:
        row = rows[p.extra["id"]]
        assert p.reference == f"{prefix}Question: {row.question}\nAnswer: " == p.counterfactual
        assert p.answer == row.answer and f"Question: {row.question}\n" not in prefix


@needs_shared
def test_gsm8k_examples_come_from_train() -> None:
    pairs = build_target_pairs(target_set("gsm8k"), TargetOptions(limit=2, data_dir=str(SHARED)))
    train = {r.question for r in read_word_problems(SHARED / "gsm8k" / "train.jsonl")}
    prefix = pairs[0].reference[: pairs[0].spans["prefix"][1]]
    questions = [block.split("\nAnswer:")[0].removeprefix("Question: ") for block in prefix.split("\n\n")[:3]]
    assert all(q in train for q in questions)


def test_word_problems_from_env_folder_and_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"id": f"r{i}", "question": f"Tom has {i} apples. How many?", "answer": str(i)} for i in range(8)]
    rows.append({"id": "neg", "question": "Below zero?", "answer": "-3"})
    (tmp_path / "svamp").mkdir()
    path = tmp_path / "svamp" / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv(locate.DATA_ENV, str(tmp_path))
    assert resolve_word_problems("svamp") == path
    pairs = build_target_pairs(target_set("svamp"), TargetOptions(limit=100))
    assert len(pairs) == 8 - 3  # three rows became the solved examples; the negative answer is skipped
    assert len(build_target_pairs(target_set(str(path)), TargetOptions(limit=2))) == 2


def test_local_test_rows_are_never_mixed_with_hub_train_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Online or offline, a local test file gives the same prompts: no train split is fetched from the hub."""
    rows = [{"id": f"r{i}", "question": f"Tom has {i} apples. How many?", "answer": str(i)} for i in range(8)]
    (tmp_path / "svamp").mkdir()
    (tmp_path / "svamp" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    only_folder(monkeypatch, tmp_path)
    monkeypatch.setattr(ts, "_from_hub", lambda name, split: (None, "offline"))
    offline = build_target_pairs(target_set("svamp"), TargetOptions(limit=100))
    calls: list[tuple[str, str]] = []

    def online(name: str, split: str) -> tuple[list[ts.WordProblem], str]:
        calls.append((name, split))
        return [ts.WordProblem(f"hub-{i}", f"Hub question {i}?", str(i)) for i in range(5)], ""

    monkeypatch.setattr(ts, "_from_hub", online)
    assert build_target_pairs(target_set("svamp"), TargetOptions(limit=100)) == offline
    assert calls == []
    (tmp_path / "svamp" / "test.jsonl").unlink()  # test rows from the hub: its train rows are the examples
    prefix = build_target_pairs(target_set("svamp"), TargetOptions(limit=2))[0].reference
    assert calls == [("svamp", "test"), ("svamp", "train")] and "Hub question" in prefix


def test_missing_data_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataError, match="does not exist; pass a .jsonl"):
        resolve_word_problems(tmp_path / "nope.jsonl")
    only_folder(monkeypatch, tmp_path)
    monkeypatch.setattr(ts, "_from_hub", lambda name, split: (None, "openai/gsm8k was not tried"))
    with pytest.raises(DataError, match=f"could not find the gsm8k test set: looked for {tmp_path}/gsm8k/test"
                                        ".*openai/gsm8k was not tried.*pass --data-dir FOLDER holding gsm8k/test"):
        resolve_word_problems("gsm8k")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no answer"}\n')
    with pytest.raises(DataError, match="line 1 is not a JSON object with question and answer"):
        read_word_problems(bad)
