"""Benchmark rows: read from a data set shipped with arithmech (or a user's JSONL, or the hub) into `EvalItem`s.

Where data come from
    A data set named "<folder>/<split>" (e.g. "gsm8k/test") is found as `arithmech.data.locate` says:
    <root>/<folder>/<split>.jsonl or .jsonl.gz under --data-dir, then $ARITHMECH_DATA, then the copy shipped
    with arithmech (every built-in benchmark is shipped); then, for the benchmarks with a known hub copy, on
    the Hugging Face hub through the optional `datasets` package (imported only then). A path ending in
    .jsonl or .jsonl.gz is read as given. `LoadedRows` records the file (or "hf:<repo>:<split>"), where it was
    found ("--data-dir", "$ARITHMECH_DATA", "shipped", "path", "hub") and the sha256 of its JSONL bytes
    (decompressed, so a shipped .jsonl.gz and its original .jsonl agree). The schemas are those of the
    shipped sets' PROVENANCE.md: math rows {"id", "question", "answer"}, choice rows {"id", "question",
    "choices", "answer": index} (a letter "B" is accepted too).

Train/test overlap (`TrainOverlap`)
    A model fine-tuned on llm_adapters_math_v1/train has seen part of the full GSM8K, SVAMP, AddSub and
    SingleEq test sets. With exclude_train_overlap the runner drops every row whose id is an `orig_id` of that
    train file, or whose normalised question text (lower case, letters and digits only) is a train question:
    the text rule also catches the 126 problems AddSub and SingleEq share, and the 51 llm_adapters test rows
    flagged `question_in_train`. The counts of both rules are recorded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arithmech.data.locate import data_sha256, find_data_file, hub_rows, is_jsonl_path, missing_data, read_data_text
from arithmech.errors import DataError
from arithmech.evaluate.answers import LETTERS, format_number

TRAIN_DATA = "llm_adapters_math_v1/train"


@dataclass(frozen=True)
class EvalItem:
    """One benchmark question. `answer` is a canonical number string (math) or a choice index (choice)."""

    id: str
    question: str
    answer: str | int
    choices: tuple[str, ...] = ()
    subject: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class LoadedRows:
    """Raw rows and where they came from (a file path with the sha256 of its JSONL bytes, or a hub name)."""

    rows: list[dict[str, Any]]
    origin: str
    sha256: str | None = None
    found_in: str = "path"
    """"--data-dir", "$ARITHMECH_DATA", "shipped", "path" (given as a file) or "hub"."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """JSON objects, one a line (.jsonl or .jsonl.gz); blank lines skipped; a problem is a DataError naming the line."""
    rows = []
    for number, line in enumerate(read_data_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} line {number} is not valid JSON ({exc.msg}); write one object per line") from exc
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number} is not a JSON object; write one object per line")
        rows.append(row)
    if not rows:
        raise DataError(f"{path} has no rows; write one JSON object per line with question and answer")
    return rows


def load_rows(data: str, data_dir: str | None = None, hub: tuple[str, str | None, str] | None = None) -> LoadedRows:
    """The rows of "<folder>/<split>" (searched in the data roots, then the hub) or of a .jsonl(.gz) path."""
    if is_jsonl_path(data):
        path = Path(data).expanduser()
        if not path.is_file():
            raise DataError(f"benchmark file {data} does not exist; check the path")
        return LoadedRows(read_jsonl(path), str(path), data_sha256(path))
    found = find_data_file(data, data_dir)
    if found is not None:
        return LoadedRows(read_jsonl(found.path), str(found.path.resolve()), data_sha256(found.path), found.label)
    why_not = None
    if hub is not None:
        rows, why_not = hub_rows(*hub)
        if rows is not None:
            name = f"hf:{hub[0]}" + (f"/{hub[1]}" if hub[1] else "") + f":{hub[2]}"
            return LoadedRows(rows, name, found_in="hub")
    raise missing_data(data, data_dir, why_not, "give a .jsonl path instead of the name")


def canonical_number(value: Any) -> str:
    """18, "18.0", "1,000" -> "18" / "1000" (the data sets' convention); anything else is a DataError."""
    text = str(value).replace(",", "").strip()
    try:
        number = float(text)
    except ValueError:
        raise DataError(f"answer {value!r} is not a number; math rows need a numeric answer") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise DataError(f"answer {value!r} is not a finite number; math rows need a numeric answer")
    return str(format_number(number))


def math_items(rows: list[dict[str, Any]], origin: str, source: str | None = None) -> list[EvalItem]:
    """Math rows -> items; with `source`, only llm_adapters rows of that source."""
    items = []
    for i, row in enumerate(rows):
        if source is not None and row.get("source") != source:
            continue
        try:
            question, answer = str(row["question"]).strip(), canonical_number(row["answer"])
        except KeyError as exc:
            raise DataError(
                f"{origin} row {i + 1} has no {exc.args[0]!r} field; math rows need question and answer"
            ) from None
        except DataError as exc:
            raise DataError(f"{origin} row {i + 1}: {exc}") from None
        extra = {k: row[k] for k in ("orig_id", "source", "question_in_train") if k in row}
        items.append(EvalItem(str(row.get("id", f"row-{i + 1}")), question, answer, extra=extra))
    if not items:
        raise DataError(f"{origin} has no rows" + (f" of source {source!r}" if source else "") + " to evaluate")
    return items


def choice_items(rows: list[dict[str, Any]], origin: str) -> list[EvalItem]:
    """Choice rows {"question", "choices", "answer": index or letter} -> items."""
    items = []
    for i, row in enumerate(rows):
        where = f"{origin} row {i + 1}"
        choices, answer = row.get("choices"), row.get("answer")
        if "question" not in row or not isinstance(choices, list) or len(choices) < 2:
            raise DataError(f"{where} needs a question and a list of at least two choices")
        if isinstance(answer, str) and answer in LETTERS[: len(choices)]:
            answer = LETTERS.index(answer)
        if not isinstance(answer, int) or not 0 <= answer < len(choices):
            raise DataError(f"{where} has answer {answer!r}; give the right choice's index (0-based) or letter")
        items.append(
            EvalItem(str(row.get("id", f"row-{i + 1}")), str(row["question"]).strip(), answer,
                     tuple(str(c).strip() for c in choices), row.get("subject"))
        )
    return items


def normalize_question(text: str) -> str:
    """Lower case, letters and digits only: the key of the text-overlap rule."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


@dataclass(frozen=True)
class TrainOverlap:
    """The orig_ids and normalised questions of a training file, to drop from evaluation."""

    origin: str
    ids: frozenset[str]
    questions: frozenset[str]
    sha256: str | None = None

    def split(self, items: list[EvalItem]) -> tuple[list[EvalItem], dict[str, list[str]]]:
        """(kept items, {"by_id": [...], "by_text": [...]} excluded ids)."""
        kept, by_id, by_text = [], [], []
        for item in items:
            if item.id in self.ids or item.extra.get("orig_id") in self.ids:
                by_id.append(item.id)
            elif normalize_question(item.question) in self.questions:
                by_text.append(item.id)
            else:
                kept.append(item)
        return kept, {"by_id": by_id, "by_text": by_text}


def train_overlap(train_file: str | None, data_dir: str | None = None) -> TrainOverlap:
    """The overlap rule of a train JSONL file (default: llm_adapters_math_v1/train in the data roots)."""
    loaded = load_rows(train_file or TRAIN_DATA, data_dir)
    ids = {str(r["orig_id"]) for r in loaded.rows if r.get("orig_id")}
    questions = {normalize_question(str(r["question"])) for r in loaded.rows if r.get("question")}
    return TrainOverlap(loaded.origin, frozenset(ids), frozenset(questions), loaded.sha256)
