"""MIB's own arithmetic data: its columns read from every local format, turned into the built-in prompts' pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arithmech.data.mib_arithmetic import mib_pairs
from arithmech.data.mib_dataset import apart_from, counterfactual_of, holds_splits, mib_dataset_pairs, read_mib_rows
from arithmech.errors import ConfigError, DataError

from tiny_models import make_multidigit_tokenizer, make_tiny_tokenizer

ROWS = [  # MIB's columns (MIB-circuit-track HFEAPDataset): prompt, label, operator, random_counterfactual
    {"prompt": "Q: How much is 12 plus 34? A:", "label": 46, "operator": "+",
     "random_counterfactual": {"prompt": "Q: How much is 25 plus 51? A:", "label": 76}},
    {"prompt": "Q: How much is 7 plus 2? A:", "label": 9, "operator": "+",
     "random_counterfactual": {"prompt": "Q: How much is 3 plus 3? A:", "label": 6}},
    {"prompt": "Q: How much is 40 minus 15? A:", "label": 25, "operator": "-",
     "random_counterfactual": {"prompt": "Q: How much is 88 minus 20? A:", "label": 68}},
    {"prompt": "Q: How much is 12 plus 30? A:", "label": 42, "operator": "+",
     "random_counterfactual": {"prompt": "Q: How much is 1 plus 3? A:", "label": 4}},  # lengths differ
    {"prompt": "Q: How much is 10 plus 31? A:", "label": 41, "operator": "+",
     "random_counterfactual": {"prompt": "Q: How much is 20 plus 22? A:", "label": 42}},  # same leading digit
    {"prompt": "Q: How much is 11 plus 11? A:", "label": 22, "operator": "+", "random_counterfactual": None},
]  # fmt: skip


def _write(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import pandas as pd

        frame = pd.DataFrame(rows)
        if path.suffix == ".csv":  # a record does not fit a CSV cell: a JSON object in it
            frame["random_counterfactual"] = [json.dumps(r["random_counterfactual"]) for r in rows]
            frame.to_csv(path, index=False)
        else:
            frame.to_parquet(path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_every_local_format_reads_mibs_columns(tmp_path: Path, suffix: str) -> None:
    rows = read_mib_rows(str(_write(tmp_path / f"add{suffix}", ROWS)))
    assert len(rows) == len(ROWS)
    assert [str(r["prompt"]) for r in rows] == [r["prompt"] for r in ROWS]
    assert counterfactual_of(rows[0]) == ("Q: How much is 25 plus 51? A:", "76")
    assert counterfactual_of(rows[-1]) is None


def test_a_save_to_disk_folder_and_dotted_csv_columns(tmp_path: Path) -> None:
    import datasets
    import pandas as pd

    data = datasets.Dataset.from_list(ROWS[:3])
    datasets.DatasetDict({"train": data, "test": data.select([0])}).save_to_disk(str(tmp_path / "saved"))
    assert len(read_mib_rows(str(tmp_path / "saved"))) == 3
    assert len(read_mib_rows(str(tmp_path / "saved"), split="test")) == 1
    with pytest.raises(ConfigError, match="has no split 'validation'; choose from train, test"):
        read_mib_rows(str(tmp_path / "saved"), split="validation")
    flat = pd.json_normalize(ROWS[:2])  # random_counterfactual.prompt, random_counterfactual.label
    flat.to_csv(tmp_path / "flat.csv", index=False)
    assert counterfactual_of(read_mib_rows(str(tmp_path / "flat.csv"))[1]) == ("Q: How much is 3 plus 3? A:", "6")


def test_rows_become_the_built_in_prompts_pairs() -> None:
    tok = make_tiny_tokenizer()  # digit tokens: the leading digit is scored, after the split-off space
    pairs, unusable = mib_dataset_pairs(tok, ROWS, "addition")
    assert [p.reference for p in pairs] == ["Q: How much is 12 plus 34? A: ", "Q: How much is 7 plus 2? A: "]
    assert unusable.count == 3  # unequal lengths, equal scored tokens, no counterfactual; the "-" row is not counted
    assert unusable.describe() == (
        "1 have a counterfactual of another token length (first: row 4), 1 score the same token in both prompts "
        "(e.g. the same leading digit) (first: row 5), 1 have a counterfactual that is no {prompt, label} record "
        "(e.g. a bare string) (first: row 6)"
    )
    first = pairs[0]
    assert first.counterfactual == "Q: How much is 25 plus 51? A: "
    assert (tok.decode([first.extra["answer_id"]]), tok.decode([first.extra["cf_answer_id"]])) == ("4", "7")
    built_in = mib_pairs(tok, "addition", 1)[0]
    assert built_in.reference.endswith("A: ")
    assert set(built_in.extra) - {"cf_a", "cf_b"} <= set(first.extra)  # a row gives no counterfactual operands
    minus, _ = mib_dataset_pairs(tok, ROWS, "subtraction")
    assert [p.answer for p in minus] == ["25"]
    whole = make_multidigit_tokenizer()  # numbers are one token: " 46" is scored whole
    pair = mib_dataset_pairs(whole, ROWS[:1], "addition")[0][0]
    assert whole.decode([pair.extra["answer_id"]]).strip() == "46"


def test_bad_sources_are_refused_in_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = _write(tmp_path / "bad.jsonl", [{"question": "1+1=", "answer": 2}])
    with pytest.raises(ConfigError, match="lacks MIB's column\\(s\\) prompt, label, random_counterfactual"):
        read_mib_rows(str(bad))
    with pytest.raises(ConfigError, match="neither a file, a folder nor a Hugging Face dataset name"):
        read_mib_rows(str(tmp_path / "missing.jsonl"))
    (tmp_path / "rows.txt").write_text("x")
    with pytest.raises(ConfigError, match="read formats are"):
        read_mib_rows(str(tmp_path / "rows.txt"))
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 would
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    with pytest.raises(DataError, match=r"hub cannot be reached .*\(HF_HUB_OFFLINE is set\); give a local copy to "
                                        "--mib-dataset") as err:
        read_mib_rows("mib-bench/arithmetic_addition")
    assert str(err.value).count(". ") == 0


def test_evaluation_rows_sharing_a_prompt_with_the_find_rows_are_dropped(tmp_path: Path) -> None:
    find = [ROWS[0], ROWS[2]]
    cf_of_first = {**ROWS[1], "prompt": ROWS[0]["random_counterfactual"]["prompt"] + " "}  # shares a prompt (spaced)
    clean_as_cf = {**ROWS[4], "random_counterfactual": {"prompt": ROWS[0]["prompt"], "label": 46}}
    test = [ROWS[0], cf_of_first, clean_as_cf, ROWS[1], ROWS[3], ROWS[2]]
    kept, dropped = apart_from(test, find, "addition")
    assert kept == [ROWS[1], ROWS[3]] and dropped == 3  # the "-" row is another operation's: neither kept nor counted
    kept, dropped = apart_from(test, find, "subtraction")
    assert kept == [] and dropped == 1
    assert apart_from(test, [], "addition") == ([r for r in test if r["operator"] == "+"], 0)


def test_which_sources_hold_splits(tmp_path: Path) -> None:
    import datasets

    data = datasets.Dataset.from_list(ROWS[:2])
    datasets.DatasetDict({"train": data}).save_to_disk(str(tmp_path / "splits"))
    data.save_to_disk(str(tmp_path / "one"))
    assert holds_splits(str(tmp_path / "splits")) and holds_splits("mib-bench/arithmetic_addition")
    assert not holds_splits(str(tmp_path / "one")) and not holds_splits(str(_write(tmp_path / "a.jsonl", ROWS)))


def test_unusable_rows_are_counted_by_reason_with_their_first_row(tmp_path: Path) -> None:
    """Issue 34.10: each reason a row cannot be scored is named, with its count and its first row in the file."""
    good, lengths, same = ROWS[0], ROWS[3], ROWS[4]
    rows = [
        {**good, "label": "forty-six"},  # row 1: a word answer
        {**good, "random_counterfactual": "Q: How much is 25 plus 51? A:"},  # row 2: a bare string
        lengths,  # row 3
        {**good, "label": [46]},  # row 4: a list
        lengths,  # row 5
        good,  # row 6: usable
        {**good, "label": None},  # row 7
        same,  # row 8
        lengths,  # row 9
    ]
    read = read_mib_rows(str(_write(tmp_path / "rows.jsonl", rows)))
    pairs, unusable = mib_dataset_pairs(make_tiny_tokenizer(), read, "addition")
    assert len(pairs) == 1 and pairs[0].extra["row"] == 5  # 0-based row of the file, as before
    assert unusable.count == 8
    assert unusable.describe().startswith("3 have a counterfactual of another token length (first: row 3), ")
    for said in ("1 have an answer whose first token is no digit (e.g. a word answer of several tokens) (first: row 1)",
                 "1 have a counterfactual that is no {prompt, label} record (e.g. a bare string) (first: row 2)",
                 "1 have a label that is a list or record, not a number (first: row 4)",
                 "1 have no prompt or no label (first: row 7)", "1 score the same token in both prompts"):  # fmt: skip
        assert said in unusable.describe(), said


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("rows.jsonl", json.dumps(ROWS[0]) + "\n{broken\n", "rows.jsonl', line 2: not JSON"),
        ("rows.json", "[\n" + json.dumps(ROWS[0]) + ",\n{broken}\n]", "rows.json', line 3: not valid JSON"),
        ("rows.jsonl", json.dumps(ROWS[0]) + "\n[1, 2]\n", "rows.jsonl', line 2: not a JSON object"),
        ("rows.csv", 'a,b\n"1,2\n', "rows.csv' is not a CSV table"),
        ("rows.parquet", "not parquet", "rows.parquet' is not a Parquet file"),
        ("rows.jsonl", "\ufeff", "holds no rows"),
    ],
)
def test_a_file_that_does_not_parse_is_one_sentence(tmp_path: Path, name: str, text: str, said: str) -> None:
    """Issue 34.11: the file and line, not pandas' traceback."""
    (tmp_path / name).write_text(text)
    with pytest.raises((ConfigError, DataError)) as err:
        read_mib_rows(str(tmp_path / name))
    assert said in str(err.value) and "\n" not in str(err.value), str(err.value)
