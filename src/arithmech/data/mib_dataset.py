"""MIB's own arithmetic data (Hugging Face `mib-bench/arithmetic_addition` / `arithmetic_subtraction`) as prompt pairs.

Columns, as MIB's own loader reads them (MIB-circuit-track, `MIB_circuit_track/dataset.py`, `HFEAPDataset` for
tasks `arithmetic_*`; the dataset card itself is empty):
    prompt                   the clean prompt, e.g. "Q: How much is 12 plus 34? A:"
    label                    its answer (a number, or its text)
    operator                 "+" or "-"; MIB keeps the rows of its task's operator (optional here)
    random_counterfactual    a record {prompt, label}: the same template with new random operands
Only these are read (MIB's arithmetic task uses `random_counterfactual`; other columns are ignored). A local copy
may be a folder written by `datasets`' `save_to_disk`, or a .json / .jsonl / .parquet / .csv file with these
columns; in a CSV file the counterfactual is a JSON object in its cell, or two columns
`random_counterfactual.prompt` and `random_counterfactual.label`.

Scored token: MIB scores the first token of the label tokenized on its own, and keeps rows whose labels are one
token. That drops every answer of two digits on a digit-splitting tokenizer (SmolLM2), so rows are scored by the
rule of the built-in prompts instead (`data/mib_arithmetic.scored_prompt`): the answer's first token as the model
continues the prompt. Rows are dropped, and counted by reason with the first row of each (`Unusable`, 1-based row
numbers of the split or file), when a prompt or label is missing, the counterfactual is no {prompt, label} record
(e.g. a bare string), a label is a list or record, an answer's first token carries no digit (a word answer), the
two prompts differ in token length (edges are patched position by position), or both scored tokens are equal.
A local file that does not parse is refused in one sentence naming the file and the line.

Splits: MIB finds circuits on `train` (its run_attribution.py's --split default) and evaluates them on
`validation` (run_evaluation.py's default, "By default, this will evaluate on the validation set", its README;
the leaderboard scores a private test split). A Hugging Face name or a `save_to_disk` folder of a DatasetDict
holds the splits; a single file or a single Dataset folder holds one table (`holds_splits`), so its evaluation
rows must come from a second source. Evaluation rows whose clean or counterfactual prompt is also a prompt of
the find rows are dropped and counted (`apart_from`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arithmech import hub
from arithmech.data.mib_arithmetic import scored_prompt
from arithmech.data.prompts import PromptPair
from arithmech.errors import ConfigError, DataError

MIB_DATASETS = {"addition": "mib-bench/arithmetic_addition", "subtraction": "mib-bench/arithmetic_subtraction"}
"""The Hugging Face datasets of MIB's arithmetic tasks, by operation."""
MIB_OPERATORS = {"+": "addition", "-": "subtraction"}
MIB_COLUMNS = ("prompt", "label", "random_counterfactual")
CF = "random_counterfactual"
LOCAL_FORMATS = (".json", ".jsonl", ".parquet", ".csv")
ROW = "__row__"
"""The 1-based number of a row in its split or file, added when it is read (messages name rows by it)."""


def read_mib_rows(source: str, split: str = "train") -> list[dict[str, Any]]:
    """The rows of a MIB arithmetic dataset: a local file or `save_to_disk` folder, else a Hugging Face name."""
    path = Path(source).expanduser()
    if path.is_dir():
        rows = _saved_rows(path, split)
    elif path.is_file():
        rows = _file_rows(path)
    elif source.count("/") == 1 and not source.startswith((".", "/", "~")):
        rows = _hub_rows(source, split)
    else:
        raise ConfigError(
            f"--mib-dataset {source!r} is neither a file, a folder nor a Hugging Face dataset name; give e.g. "
            f"{MIB_DATASETS['addition']} or a local copy ({', '.join(LOCAL_FORMATS)}, or a save_to_disk folder)"
        )
    if not rows:
        raise DataError(f"--mib-dataset {source!r} holds no rows (split {split!r})")
    missing = [c for c in MIB_COLUMNS if c not in rows[0] and not (c == CF and f"{CF}.prompt" in rows[0])]
    if missing:
        raise ConfigError(
            f"--mib-dataset {source!r} lacks MIB's column(s) {', '.join(missing)} (it has {', '.join(rows[0])}); "
            f"give MIB's arithmetic data with columns {', '.join(MIB_COLUMNS)}"
        )
    return [{**row, ROW: number} for number, row in enumerate(rows, 1)]


def _hub_rows(name: str, split: str) -> list[dict[str, Any]]:
    offline = hub.unreachable()
    if offline is not None:  # at once, not after the library's retries
        raise DataError(
            f"--mib-dataset {name!r} is a Hugging Face dataset, and the hub cannot be reached from this machine "
            f"({offline}); give a local copy to --mib-dataset (a save_to_disk folder or a .jsonl/.parquet/.csv file)"
        )
    import datasets

    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as err:  # offline, unknown name or split: datasets raises many kinds
        raise DataError(
            f"could not load the Hugging Face dataset {name!r} (split {split!r}: {type(err).__name__}); without "
            "network, give a local copy to --mib-dataset (a save_to_disk folder or a .jsonl/.parquet/.csv file)"
        ) from None
    return [dict(row) for row in data]


def _saved_rows(path: Path, split: str) -> list[dict[str, Any]]:
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except Exception as err:
        raise ConfigError(f"--mib-dataset {str(path)!r} is not a folder written by save_to_disk ({err})") from None
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ConfigError(f"--mib-dataset {str(path)!r} has no split {split!r}; choose from {', '.join(data)}")
        data = data[split]
    return [dict(row) for row in data]  # type: ignore[union-attr]


def _file_rows(path: Path) -> list[dict[str, Any]]:
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix not in LOCAL_FORMATS:
        raise ConfigError(f"--mib-dataset {str(path)!r}: read formats are {', '.join(LOCAL_FORMATS)} (or a folder)")
    if suffix == ".parquet":
        try:
            frame = pd.read_parquet(path)
        except Exception as err:  # pyarrow raises its own kinds
            raise ConfigError(f"--mib-dataset {str(path)!r} is not a Parquet file ({type(err).__name__}); give MIB's "
                              "rows as .parquet, .jsonl, .json or .csv") from None  # fmt: skip
    elif suffix == ".csv":
        try:
            frame = pd.read_csv(path)
        except (ValueError, UnicodeDecodeError) as err:  # pandas' ParserError and EmptyDataError are ValueErrors
            raise ConfigError(f"--mib-dataset {str(path)!r} is not a CSV table ({str(err).splitlines()[0]})") from None
    else:
        frame = pd.DataFrame(_json_records(path, suffix == ".jsonl"))
    records = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return [{str(k): v for k, v in row.items()} for row in records]


def _json_records(path: Path, jsonl: bool) -> list[dict[str, Any]]:
    """The rows of a .json file (a list of objects, or JSON lines) or a .jsonl file; one ConfigError naming the
    file and line where it does not parse (rather than pandas' traceback)."""
    where = f"--mib-dataset {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text; save it as UTF-8 JSON lines (one row per line)") from None
    if not jsonl and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}, line {err.lineno}: not valid JSON ({err.msg}); give a JSON list of rows, or "
                              "one JSON object per line (.jsonl)") from None  # fmt: skip
        numbered = list(enumerate(rows if isinstance(rows, list) else [rows], 1))
    else:
        numbered = []
        for line_no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                numbered.append((line_no, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ConfigError(f"{where}, line {line_no}: not JSON ({err.msg}); write one JSON object per line, "
                                  "with MIB's columns prompt, label, random_counterfactual") from None  # fmt: skip
    bad = next((n for n, row in numbered if not isinstance(row, dict)), None)
    if bad is not None:
        raise ConfigError(f"{where}, {'line' if jsonl or not text.lstrip().startswith('[') else 'row'} {bad}: not a "
                          "JSON object; give one object per row, with MIB's columns prompt, label, "
                          "random_counterfactual")  # fmt: skip
    return [row for _, row in numbered]


def counterfactual_of(row: dict[str, Any]) -> tuple[str, str] | None:
    """(prompt, label) of a row's random counterfactual, from a record, a JSON object or dotted columns."""
    value = row.get(CF)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if value is None and f"{CF}.prompt" in row:
        value = {"prompt": row[f"{CF}.prompt"], "label": row.get(f"{CF}.label")}
    if not isinstance(value, dict) or value.get("prompt") is None or value.get("label") is None:
        return None
    return str(value["prompt"]), _label(value["label"])


def _label(value: Any) -> str:
    """A label as the answer's text: 46, 46.0 (a CSV column read as floats) and "46" all give "46"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def holds_splits(source: str) -> bool:
    """Whether `source` holds named splits: a Hugging Face name or a `save_to_disk` folder of a DatasetDict (not a
    single file or a single Dataset's folder)."""
    path = Path(source).expanduser()
    if path.is_file():
        return False
    if path.is_dir():
        return (path / "dataset_dict.json").is_file()
    return True


def row_operation(row: dict[str, Any]) -> str | None:
    """The operation of a row by its operator column ("+" -> addition), None when the row names none."""
    operator = row.get("operator")
    return None if operator is None else MIB_OPERATORS.get(str(operator).strip(), "")


def _prompts_of(row: dict[str, Any]) -> set[str]:
    """The clean and counterfactual prompt texts of a row, stripped."""
    cf = counterfactual_of(row)
    return {str(p).strip() for p in (row.get("prompt"), cf[0] if cf else None) if p is not None}


def apart_from(
    rows: list[dict[str, Any]], find_rows: list[dict[str, Any]], operation: str
) -> tuple[list[dict[str, Any]], int]:
    """The rows of `operation` none of whose prompts (clean or counterfactual) is a prompt of `find_rows`, and
    how many of that operation's rows were dropped for sharing one."""
    seen = set().union(*(_prompts_of(r) for r in find_rows)) if find_rows else set()
    mine = [r for r in rows if row_operation(r) in (None, operation)]
    kept = [r for r in mine if not _prompts_of(r) & seen]
    return kept, len(mine) - len(kept)


@dataclass
class Unusable:
    """Rows dropped before the model sees them, by reason: reason -> their row numbers."""

    rows: dict[str, list[int]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(numbers) for numbers in self.rows.values())

    def add(self, reason: str, row: int) -> None:
        self.rows.setdefault(reason, []).append(row)

    def describe(self) -> str:
        """"5 have a counterfactual of another token length (first: row 3), 3 have ..." (most common first)."""
        ranked = sorted(self.rows.items(), key=lambda item: -len(item[1]))
        return ", ".join(f"{len(numbers)} {reason} (first: row {numbers[0]})" for reason, numbers in ranked)


NO_FIELDS = "have no prompt or no label"
NO_RECORD = "have a counterfactual that is no {prompt, label} record (e.g. a bare string)"
NOT_A_NUMBER = "have a label that is a list or record, not a number"
NO_DIGIT = "have an answer whose first token is no digit (e.g. a word answer of several tokens)"
LENGTHS = "have a counterfactual of another token length"
SAME_TOKEN = "score the same token in both prompts (e.g. the same leading digit)"


def mib_dataset_pairs(
    tokenizer: Any, rows: list[dict[str, Any]], operation: str
) -> tuple[list[PromptPair], Unusable]:
    """The rows of `operation` as prompt pairs with their scored tokens (as `mib_arithmetic.mib_pairs` makes them),
    and that operation's unusable rows by reason (see the module docstring)."""
    pairs: list[PromptPair] = []
    unusable = Unusable()
    for i, row in enumerate(rows):
        if row_operation(row) not in (None, operation):
            continue
        number = int(row.get(ROW, i + 1))
        pair = _pair(tokenizer, row, operation, number - 1)
        if isinstance(pair, str):
            unusable.add(pair, number)
        else:
            pairs.append(pair)
    return pairs, unusable


def _pair(tokenizer: Any, row: dict[str, Any], operation: str, index: int) -> PromptPair | str:
    """The row as a prompt pair, or why it is unusable."""
    if row.get("prompt") is None or row.get("label") is None:
        return NO_FIELDS
    cf = counterfactual_of(row)
    if cf is None:
        return NO_RECORD
    cf_label = row[CF].get("label") if isinstance(row.get(CF), dict) else None
    if isinstance(row["label"], list | tuple | dict) or isinstance(cf_label, list | tuple | dict):
        return NOT_A_NUMBER
    answer = _label(row["label"])
    clean = scored_prompt(tokenizer, str(row["prompt"]), answer)
    counter = scored_prompt(tokenizer, cf[0], cf[1])
    if clean is None or counter is None:
        return NO_DIGIT
    if clean[2] != counter[2]:
        return LENGTHS
    if clean[1] == counter[1]:
        return SAME_TOKEN
    return PromptPair(
        reference=clean[0], counterfactual=counter[0], answer=answer, operation=operation, template_id="mib-dataset",
        extra={"cf_answer": cf[1], "answer_id": clean[1], "cf_answer_id": counter[1], "row": index},
    )  # fmt: skip
