"""Bring your own prompts: read and write prompt pairs as JSONL, one object per line.

A user can run every stage on their own reference / counterfactual prompts instead of the generated ones.
Each line is `{"reference": "...", "counterfactual": "...", "answer": "8"}`; template_id, operation,
formation, a, b and spans are optional and honoured; any other field is kept in `PromptPair.extra` and
written back at the top level, so a round trip is lossless. Every problem is one DataError naming the file
and its lines (the first few, and a count); a line breaking a rule of `pair_checks.text_problem` (an answer
that is not a number, a counterfactual that is the reference) is refused the same way. Files are read as
UTF-8 (a byte-order mark is fine) and written atomically (a reader never sees half a file).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from arithmech.data.pair_checks import Findings, Location, Problem, describe, text_problem
from arithmech.data.prompts import PromptPair
from arithmech.errors import DataError
from arithmech.runs import atomic_open

logger = logging.getLogger(__name__)

REQUIRED_FIELDS: tuple[str, ...] = ("reference", "counterfactual", "answer")
OPTIONAL_FIELDS: tuple[str, ...] = ("template_id", "operation", "formation", "a", "b")
_NUMBER_FIELDS = ("answer", "a", "b")  # numbers in JSON are accepted here and converted to str
_RESERVED = (*REQUIRED_FIELDS, *OPTIONAL_FIELDS, "spans")


def read_prompt_file(path: str | os.PathLike[str]) -> list[PromptPair]:
    """Read prompt pairs from a JSONL file, UTF-8 with or without a byte-order mark; blank lines are skipped.

    Every line is checked (its JSON, then `pair_checks.text_problem`), and one DataError names the lines with
    the first kind of problem. A reference given two different answers is refused; a line repeating an
    earlier one exactly is kept and named in a warning.
    """
    source = Path(path)
    if not source.is_file():
        raise DataError(f"prompt file {source} does not exist; check the path")
    lines = _text(source).split("\n")  # not splitlines(): U+2028 and the like may stand inside a JSON string
    rows = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    findings = Findings(total=len(rows), noun="line")
    pairs: list[PromptPair] = []
    for number, line in rows:
        where = Location(number, str(source))
        try:
            pair = _parse_line(line, str(source), number)
        except _BadLine as bad:
            findings.add(where, bad.problem)
            continue
        problem = text_problem(pair)
        findings.add(where, problem)
        if problem is None:
            pairs.append(pair)
    _check_repeats(pairs, findings)
    findings.refuse()
    if not pairs:
        raise DataError(
            f"prompt file {source} has no rows; write one JSON object per line with reference, "
            "counterfactual and answer"
        )
    logger.info("read %d prompt pairs from %s", len(pairs), source)
    return pairs


def _text(source: Path) -> str:
    """The file's text: UTF-8, a leading byte-order mark dropped; anything else is one DataError."""
    raw = source.read_bytes()
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DataError(f"prompt file {source} is UTF-16 text, not UTF-8; save it as UTF-8 JSONL")
    if b"\x00" in raw[:65536]:
        raise DataError(f"prompt file {source} is a binary file, not JSONL text; pass your JSONL prompt file")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(
            f"prompt file {source} line {line} is not UTF-8 text; save the file as UTF-8 JSONL"
        ) from exc


def _check_repeats(pairs: list[PromptPair], findings: Findings) -> None:
    """Refuse a reference given two different answers; warn about lines repeating an earlier line exactly."""
    answers: dict[str, PromptPair] = {}
    seen: set[tuple[str, str, str]] = set()
    repeats: list[Location] = []
    for pair in pairs:
        assert pair.line is not None and pair.source is not None  # set by _parse_line
        where = Location(pair.line, pair.source)
        first = answers.setdefault(pair.reference, pair)
        if first.answer != pair.answer:
            findings.add(where, Problem(
                "the same reference is given another answer on an earlier line",
                f"answer {pair.answer!r} here, {first.answer!r} on line {first.line}",
                "keep one answer per reference",
            ))  # fmt: skip
        key = (pair.reference, pair.counterfactual, pair.answer)
        if key in seen:
            repeats.append(where)
        seen.add(key)
    if repeats:
        logger.warning(
            "%s: repeat an earlier line exactly; each copy counts again in every mean and can be sampled "
            "twice, so remove them unless that is meant",
            describe(repeats, findings.total, "line"),
        )


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


class _BadLine(Exception):
    """A line that is not a prompt pair, and why."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.what)
        self.problem = problem


_ONE_OBJECT = "write one JSON object per line"


def _parse_line(line: str, source: str, number: int) -> PromptPair:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _BadLine(Problem("not JSON, so the file is not JSONL", exc.msg, _ONE_OBJECT)) from exc
    if not isinstance(row, dict):
        raise _BadLine(Problem("a JSON value that is not an object", f"a {type(row).__name__}", _ONE_OBJECT))
    missing = [name for name in REQUIRED_FIELDS if name not in row]
    if missing:
        raise _BadLine(Problem("missing required fields", f"no {', '.join(missing)}", "add them"))
    values = {name: _string_field(row, name) for name in (*REQUIRED_FIELDS, *OPTIONAL_FIELDS)}
    for name in ("reference", "counterfactual", "answer"):
        if not values[name]:
            raise _BadLine(Problem(f"an empty {name}", f'"{name}": ""', f"give the {name} text"))
    extra = {key: value for key, value in row.items() if key not in _RESERVED}
    spans = _parse_spans(row.get("spans"), values["reference"])
    return PromptPair(**values, spans=spans, extra=extra, source=source, line=number)


def _string_field(row: dict[str, Any], name: str) -> Any:
    """The field as a string (None if optional and absent); numbers are accepted for answer, a and b."""
    value = row.get(name)
    if value is None and name in OPTIONAL_FIELDS:
        return None
    if name in _NUMBER_FIELDS and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise _BadLine(Problem(f"a non-string {name}", f"{name} {value!r}", "write it as a JSON string"))
    return value


def _parse_spans(raw: Any, reference: str) -> dict[str, tuple[int, int]]:
    if raw is None:
        return {}
    fix = 'write spans as {"A": [start, end], ...} with character offsets inside reference'
    if not isinstance(raw, dict):
        raise _BadLine(Problem("spans that are not an object", f"spans {raw!r}", fix))
    spans: dict[str, tuple[int, int]] = {}
    for name, span in raw.items():
        ok = (
            isinstance(span, list)
            and len(span) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            and 0 <= span[0] <= span[1] <= len(reference)
        )
        if not ok:
            raise _BadLine(Problem("an invalid span", f"{name}={span!r}", fix))
        spans[name] = (span[0], span[1])
    return spans
