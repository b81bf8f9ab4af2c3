"""Arithmetic prompt templates, kept as data (templates.json) so they can be read, counted and extended.

Zhang et al. (2024, section 3) use 36 templates over four operations and three formations (Equation,
Statement, Question-Answer) but do not publish them; ours are in `templates.json`. Each template names the
operator span exactly as it appears in its text and an irrelevant counterfactual operator of the same token
length (for SmolLM2), so the counterfactual prompt differs from the reference only at the operator.
Every text ends with one space: digit-splitting tokenizers put a separate space token before a number, so
the next token is then the answer's first digit. An optional `family` names a template's near-copies (the same
text once whitespace is removed, a leading "Calculate:" dropped and "How much is" read as "What is"), which the
fine-tuning split holds out together (data/arithmetic_split.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from arithmech.errors import DataError

OPERATIONS: tuple[str, ...] = ("addition", "subtraction", "multiplication", "division")
FORMATIONS: tuple[str, ...] = ("equation", "statement", "qa")
SLOT_A = "{A}"
SLOT_B = "{B}"
_FIELDS = ("id", "operation", "formation", "text", "operator", "counterfactual_operator")


@dataclass(frozen=True)
class Rendered:
    """A template filled with operands: the text and the character spans of A, B and the operator in it."""

    text: str
    spans: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class Template:
    """One arithmetic prompt template with `{A}` and `{B}` slots and a known operator span."""

    id: str
    operation: str
    formation: str
    text: str
    operator: str
    counterfactual_operator: str
    family: str = ""
    """The template's family of near-copies (templates.json), held out together by a split; "" = its own."""

    @property
    def family_id(self) -> str:
        return self.family or self.id

    def render(self, a: str, b: str, counterfactual: bool = False) -> Rendered:
        """Fill the slots with `a` and `b` (and swap in the counterfactual operator if asked)."""
        operator = self.counterfactual_operator if counterfactual else self.operator
        marked = [
            (self.text.index(SLOT_A), len(SLOT_A), "A", a),
            (self.text.index(SLOT_B), len(SLOT_B), "B", b),
            (_operator_starts(self)[0], len(self.operator), "operator", operator),
        ]
        # Walk the three marked spans in text order, tracking where each lands in the output.
        out: list[str] = []
        spans: dict[str, tuple[int, int]] = {}
        cursor = length = 0
        for start, width, name, value in sorted(marked):
            out.extend((self.text[cursor:start], value))
            length += start - cursor
            spans[name] = (length, length + len(value))
            length += len(value)
            cursor = start + width
        out.append(self.text[cursor:])
        return Rendered(text="".join(out), spans=spans)


def default_templates_path() -> Path:
    """Path of the templates file shipped with the package."""
    return Path(str(resources.files("arithmech.data").joinpath("templates.json")))


def load_templates(path: str | os.PathLike[str] | None = None) -> list[Template]:
    """Read and validate templates from `path` (default: the built-in templates.json)."""
    source = Path(path) if path is not None else default_templates_path()
    if not source.is_file():
        raise DataError(f"templates file {source} does not exist; pass the path of a templates JSON file")
    try:
        raw = json.loads(source.read_text(encoding="utf-8-sig"))  # a byte-order mark is fine
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"templates file {source} is not valid JSON ({exc}); fix the JSON syntax") from exc
    rows = raw.get("templates") if isinstance(raw, dict) else raw
    if not isinstance(rows, list) or not rows:
        raise DataError(
            f"templates file {source} has no templates; give a non-empty list, or an object with a "
            "'templates' list"
        )
    templates = [_parse_template(row, index) for index, row in enumerate(rows)]
    seen: set[str] = set()
    for template in templates:
        if template.id in seen:
            raise DataError(
                f"template id '{template.id}' is used twice in {source}; give each template a unique id"
            )
        seen.add(template.id)
    return templates


def select_templates(
    templates: list[Template],
    operations: tuple[str, ...] | None = None,
    formations: tuple[str, ...] | None = None,
    template_ids: tuple[str, ...] | None = None,
) -> list[Template]:
    """Keep the templates matching every filter that is given (None = no filter)."""
    return [
        t
        for t in templates
        if (operations is None or t.operation in operations)
        and (formations is None or t.formation in formations)
        and (template_ids is None or t.id in template_ids)
    ]


def _parse_template(row: Any, index: int) -> Template:
    """Build one Template from a JSON object, raising DataError with the fix on the first problem."""
    if not isinstance(row, dict):
        raise DataError(f"template number {index + 1} is not a JSON object; write each template as an object")
    label = f"template '{row['id']}'" if isinstance(row.get("id"), str) else f"template number {index + 1}"
    missing = [name for name in _FIELDS if name not in row]
    if missing:
        raise DataError(f"{label} is missing {', '.join(missing)}; every template needs {', '.join(_FIELDS)}")
    for name in _FIELDS:
        if not isinstance(row[name], str) or not row[name]:
            raise DataError(f"{label} has an empty or non-string '{name}'; give it a non-empty string")
    family = row.get("family", "")
    if not isinstance(family, str):
        raise DataError(f"{label} has a non-string 'family'; name its family of near-copies with a string")
    template = Template(**{name: row[name] for name in _FIELDS}, family=family)
    _validate(template, label)
    return template


def _validate(t: Template, label: str) -> None:
    """Check one template's operation, formation, slots and operator spans."""
    if t.operation not in OPERATIONS:
        raise DataError(f"{label} has unknown operation '{t.operation}'; use one of {', '.join(OPERATIONS)}")
    if t.formation not in FORMATIONS:
        raise DataError(f"{label} has unknown formation '{t.formation}'; use one of {', '.join(FORMATIONS)}")
    for slot in (SLOT_A, SLOT_B):
        count = t.text.count(slot)
        if count != 1:
            what = "no" if count == 0 else f"{count}"
            raise DataError(
                f"{label} has {what} {slot} slot{'s' if count > 1 else ''}; put {{A}} and {{B}} once each "
                "where the operands go"
            )
    if t.operator not in t.text:
        raise DataError(
            f"{label} has operator '{t.operator}' that is not in its text; set operator to the operator "
            "span exactly as it appears in text"
        )
    if len(_operator_starts(t)) != 1:
        raise DataError(
            f"{label} has operator '{t.operator}' that does not occur exactly once outside the slots; "
            "choose an operator span that appears once in text"
        )
    if t.counterfactual_operator == t.operator:
        raise DataError(
            f"{label} has a counterfactual_operator equal to its operator; "
            "choose an irrelevant word or symbol"
        )
    if not t.text.endswith(" ") or t.text.endswith("  "):
        raise DataError(
            f"{label} text does not end with exactly one space; end it with one space so the next token is "
            "the answer's first digit"
        )


def _operator_starts(t: Template) -> list[int]:
    """Start offsets of the operator in the template text that do not overlap a slot."""
    slots = [(t.text.find(s), t.text.find(s) + len(s)) for s in (SLOT_A, SLOT_B)]
    starts = []
    index = t.text.find(t.operator)
    while index != -1:
        end = index + len(t.operator)
        if all(end <= lo or index >= hi for lo, hi in slots):
            starts.append(index)
        index = t.text.find(t.operator, index + 1)
    return starts
