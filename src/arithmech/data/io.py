"""Bring your own prompts: read and write prompt pairs as JSONL, one object per line.

A user can run every stage on their own reference / counterfactual prompts instead of the generated ones.
Each line is `{"reference": "...", "counterfactual": "...", "answer": "8"}`; template_id, operation,
formation, a, b and spans are optional and honoured; any other field is kept in `PromptPair.extra` and
written back at the top level, so a round trip is lossless. Every problem is one DataError naming the file
and line. Files are written atomically (a reader never sees half a file).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from arithmech.data.prompts import PromptPair
from arithmech.errors import DataError
from arithmech.runs import atomic_open

logger = logging.getLogger(__name__)

REQUIRED_FIELDS: tuple[str, ...] = ("reference", "counterfactual", "answer")
OPTIONAL_FIELDS: tuple[str, ...] = ("template_id", "operation", "formation", "a", "b")
_NUMBER_FIELDS = ("answer", "a", "b")  # numbers in JSON are accepted here and converted to str
_RESERVED = (*REQUIRED_FIELDS, *OPTIONAL_FIELDS, "spans")


def read_prompt_file(path: str | os.PathLike[str]) -> list[PromptPair]:
    """Read prompt pairs from a JSONL file; blank lines are skipped."""
    source = Path(path)
    if not source.is_file():
        raise DataError(f"prompt file {source} does not exist; check the path")
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"prompt file {source} is not UTF-8 text; save it as UTF-8 JSONL") from exc
    pairs = [
        _parse_line(line, f"{source} line {number}") for number, line in enumerate(lines, 1) if line.strip()
    ]
    if not pairs:
        raise DataError(
            f"prompt file {source} has no rows; write one JSON object per line with reference, "
            "counterfactual and answer"
        )
    logger.info("read %d prompt pairs from %s", len(pairs), source)
    return pairs


def write_prompt_file(path: str | os.PathLike[str], pairs: list[PromptPair]) -> None:
    """Write prompt pairs as JSONL, atomically; `read_prompt_file` gives the same pairs back."""
    rows = [json.dumps(_to_row(pair, index), ensure_ascii=False) for index, pair in enumerate(pairs, 1)]
    with atomic_open(path) as handle:
        for row in rows:
            handle.write(row + "\n")
    logger.info("wrote %d prompt pairs to %s", len(rows), path)


def _to_row(pair: PromptPair, index: int) -> dict[str, Any]:
    clash = sorted(set(pair.extra) & set(_RESERVED))
    if clash:
        raise DataError(
            f"prompt pair {index} has extra field(s) {', '.join(clash)} that clash with built-in fields; "
            "rename them"
        )
    row: dict[str, Any] = {name: getattr(pair, name) for name in REQUIRED_FIELDS}
    row.update({name: getattr(pair, name) for name in OPTIONAL_FIELDS if getattr(pair, name) is not None})
    if pair.spans:
        row["spans"] = {name: list(span) for name, span in pair.spans.items()}
    row.update(pair.extra)
    try:
        json.dumps(row)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"prompt pair {index} has a value JSON cannot hold ({exc}); keep extra values plain"
        ) from exc
    return row


def _parse_line(line: str, where: str) -> PromptPair:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{where} is not JSON, so the file is not JSONL ({exc.msg}); write one JSON object per line"
        ) from exc
    if not isinstance(row, dict):
        raise DataError(
            f"{where} is a JSON {type(row).__name__}, not an object; write one JSON object per line"
        )
    missing = [name for name in REQUIRED_FIELDS if name not in row]
    if missing:
        raise DataError(f"{where} is missing the field(s) {', '.join(missing)}; add them")
    values = {name: _string_field(row, name, where) for name in (*REQUIRED_FIELDS, *OPTIONAL_FIELDS)}
    for name in ("reference", "counterfactual", "answer"):
        if not values[name]:
            raise DataError(f"{where} has an empty {name}; give the {name} text")
    extra = {key: value for key, value in row.items() if key not in _RESERVED}
    return PromptPair(**values, spans=_parse_spans(row.get("spans"), values["reference"], where), extra=extra)


def _string_field(row: dict[str, Any], name: str, where: str) -> Any:
    """The field as a string (None if optional and absent); numbers are accepted for answer, a and b."""
    value = row.get(name)
    if value is None and name in OPTIONAL_FIELDS:
        return None
    if name in _NUMBER_FIELDS and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise DataError(f"{where} has a non-string {name} ({value!r}); write it as a JSON string")
    return value


def _parse_spans(raw: Any, reference: str, where: str) -> dict[str, tuple[int, int]]:
    if raw is None:
        return {}
    fix = 'write spans as {"A": [start, end], ...} with character offsets inside reference'
    if not isinstance(raw, dict):
        raise DataError(f"{where} has spans that are not an object; {fix}")
    spans: dict[str, tuple[int, int]] = {}
    for name, span in raw.items():
        ok = (
            isinstance(span, list)
            and len(span) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            and 0 <= span[0] <= span[1] <= len(reference)
        )
        if not ok:
            raise DataError(f"{where} has an invalid span {name}={span!r}; {fix}")
        spans[name] = (span[0], span[1])
    return spans
