"""Benchmark rows: read from ../shared/data (or a user's JSONL, or the Hugging Face hub) into `EvalItem`s.

Where data come from
    A data set named "<folder>/<split>" (e.g. "gsm8k/test") is looked up as <root>/<folder>/<split>.jsonl in
    the roots of `arithmech.data.target_sets.data_roots` (--data-dir, $ARITHMECH_DATA, ../shared/data), then,
    for the benchmarks with a known hub copy, on the Hugging Face hub through the optional `datasets` package
    (imported only then). A path ending in .jsonl is read as given. The schemas are those of
    ../shared/data/README.md: math rows {"id", "question", "answer"}, choice rows {"id", "question",
    "choices", "answer": index} (a letter "B" is accepted too).

Train/test overlap (`TrainOverlap`)
    A model fine-tuned on llm_adapters_math_v1/train has seen part of the full GSM8K, SVAMP, AddSub and
    SingleEq test sets. With exclude_train_overlap the runner drops every row whose id is an `orig_id` of that
    train file, or whose normalised question text (lower case, letters and digits only) is a train question:
    the text rule also catches the 126 problems AddSub and SingleEq share, and the 51 llm_adapters test rows
    flagged `question_in_train`. The counts of both rules are recorded.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arithmech.data.target_sets import DATA_ENV, data_roots
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
    """Raw rows and where they came from (a file path with its sha256, or a hub name)."""

    rows: list[dict[str, Any]]
    origin: str
    sha256: str | None = None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """JSON objects, one a line; blank lines skipped; every problem is a DataError naming the line."""
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"could not read {path} as UTF-8 text ({exc}); check the path") from exc
    for number, line in enumerate(lines, 1):
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
    """The rows of "<folder>/<split>" (searched in the data roots, then the hub) or of a .jsonl path."""
    if data.endswith(".jsonl"):
        path = Path(data).expanduser()
        if not path.is_file():
            raise DataError(f"benchmark file {data} does not exist; check the path")
        return LoadedRows(read_jsonl(path), str(path), _sha256(path))
    roots = data_roots(data_dir)
    for root in roots:
        path = root / f"{data}.jsonl"
        if path.is_file():
            return LoadedRows(read_jsonl(path), str(path.resolve()), _sha256(path))
    if hub is not None:
        rows = rows_from_hub(*hub)
        if rows is not None:
            return LoadedRows(rows, f"hf:{hub[0]}" + (f"/{hub[1]}" if hub[1] else "") + f":{hub[2]}")
    where = ", ".join(str(root / f"{data}.jsonl") for root in roots)
    hint = " or on the hub (the datasets package is missing or offline)" if hub else ""
    raise DataError(f"could not find {data} in {where}{hint}; pass --data-dir, set ${DATA_ENV} or give a .jsonl path")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


# --- Hugging Face hub ---------------------------------------------------------------------------------------

def rows_from_hub(repo: str, config: str | None, split: str) -> list[dict[str, Any]] | None:
    """Rows of a hub data set in the ../shared/data schema, or None when `datasets` is missing or offline."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        data = datasets.load_dataset(repo, config, split=split)
    except Exception:  # offline, renamed or no such split: the caller raises one DataError
        return None
    return [hub_row(repo, dict(row), i) for i, row in enumerate(data)]


def hub_row(repo: str, row: dict[str, Any], index: int) -> dict[str, Any]:
    """One hub row in the local schema (the conversions of ../shared/data/README.md)."""
    name = repo.split("/")[-1].lower()
    if repo == "openai/gsm8k":
        return {"id": f"gsm8k-hub-{index:04d}", "question": row["question"],
                "answer": row["answer"].split("####")[-1].replace(",", "").strip()}
    if repo == "ChilleD/SVAMP":
        body = row["Body"].rstrip()
        question = body + ("" if body.endswith((".", "?", "!")) else ".") + " " + row["Question"].strip()
        return {"id": f"svamp-{row.get('ID', index)}", "question": question, "answer": row["Answer"]}
    if repo == "cais/mmlu":
        return {"id": f"mmlu-hub-{row['subject']}-{index:05d}", "subject": row["subject"],
                "question": row["question"], "choices": list(row["choices"]), "answer": int(row["answer"])}
    if repo == "tau/commonsense_qa":
        labels = list(row["choices"]["label"])
        return {"id": row["id"], "question": row["question"], "choices": list(row["choices"]["text"]),
                "answer": labels.index(row["answerKey"])}
    return {"id": f"{name}-{index:05d}", **row}
