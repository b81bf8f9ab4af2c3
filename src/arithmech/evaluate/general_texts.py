"""The texts of the general-ability check (`evaluate/general.py` scores them), read without torch.

Built in: `data/general_text.jsonl`, 30 paragraphs of plain English written for this package. Or a user's file:
JSONL rows with "text" (and optionally "id"), or plain text whose paragraphs are separated by blank lines; UTF-8,
a byte-order mark is fine. `EvaluateConfig.check_files` reads a user's file before a model loads, so a malformed
one fails at once.

Usage
    >>> texts = load_general_texts("my_paragraphs.txt")   # [GeneralText("text-1", "..."), ...]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from arithmech.errors import DataError


@dataclass(frozen=True)
class GeneralText:
    id: str
    text: str


def default_general_text_path() -> Path:
    """The built-in general-text sample shipped with the package."""
    return Path(str(resources.files("arithmech.data").joinpath("general_text.jsonl")))


def load_general_texts(path: str | Path | None = None) -> list[GeneralText]:
    """Texts from a JSONL file with "text" fields, or from plain text split at blank lines."""
    source = Path(path) if path is not None else default_general_text_path()
    if not source.is_file():
        raise DataError(f"general text file {source} does not exist; check the path")
    try:
        raw = source.read_text(encoding="utf-8-sig")  # a byte-order mark is fine
    except UnicodeDecodeError as exc:
        raise DataError(f"general text file {source} is not UTF-8 text ({exc.reason}); save it as UTF-8") from exc
    texts = []
    if source.suffix == ".jsonl":
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                texts.append(GeneralText(str(row.get("id", f"text-{number}")), str(row["text"]).strip()))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise DataError(f"{source} line {number} is not a JSON object with a text field ({exc})") from exc
    else:
        paragraphs = [p.strip() for p in raw.replace("\r\n", "\n").split("\n\n")]
        texts = [GeneralText(f"text-{i + 1}", p) for i, p in enumerate(q for q in paragraphs if q)]
    texts = [t for t in texts if t.text]
    if not texts:
        raise DataError(f"{source} holds no text; give paragraphs separated by blank lines or JSONL with text")
    return texts
