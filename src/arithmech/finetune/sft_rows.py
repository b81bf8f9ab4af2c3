"""Supervised fine-tuning rows: the examples (question, target) of a training set, read without torch.

Rows and targets
    A source is a known name (`llm_adapters_math_v1`, `gsm8k`: their train split, found as `data/locate.py` says:
    --data-dir, $ARITHMECH_DATA, then the copy shipped with arithmech) or any JSONL file (.jsonl or .jsonl.gz)
    with `question` and `answer` (and `rationale`) fields.
    - target "rationale": the rationale, for rows that have one and whose `rationale_correct` is not false (the
      LLM-Adapters rationales are often wrong, see its PROVENANCE.md); GSM8K's calculator annotations `<<...>>`
      are removed, and " The answer is N." is appended when the rationale does not already say "answer is".
    - target "answer": the final answer alone.
    Rows skipped for either reason are counted.

The CLI reads a user's file with `read_sft_examples` before a model loads (`FinetuneConfig.check_files`), so a
malformed one fails at once; `data.py` tokenizes and batches the examples.

Usage
    >>> examples, counts = read_sft_examples(resolve_sft_data("gsm8k"), "rationale")
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arithmech.data.locate import find_data_file, missing_data, read_data_text
from arithmech.errors import ConfigError, DataError
from arithmech.finetune.settings import TARGETS

ARITHMETIC = "arithmetic"
"""The data name of the arithmetic template split (`arithmetic_data.py`): generated, no file to read."""
KNOWN_TRAIN_SETS: dict[str, str] = {"llm_adapters_math_v1": "llm_adapters_math_v1", "gsm8k": "gsm8k"}
_CALCULATOR = re.compile(r"<<[^>]*>>")


@dataclass(frozen=True)
class SFTExample:
    id: str
    question: str
    target: str


def resolve_sft_data(source: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The JSONL file of a known training set name (its train split) or of a path."""
    if source not in KNOWN_TRAIN_SETS:
        path = Path(source)
        if not path.is_file():
            raise DataError(
                f"training data {source!r} is neither a file nor one of {', '.join(KNOWN_TRAIN_SETS)}; "
                "pass a JSONL path with question and answer fields"
            )
        return path
    name = f"{KNOWN_TRAIN_SETS[source]}/train"
    found = find_data_file(name, data_dir)
    if found is None:
        raise missing_data(name, data_dir, None, "give a .jsonl path to --data")
    return found.path


def read_sft_examples(path: Path, target: str = "rationale") -> tuple[list[SFTExample], dict[str, int]]:
    """Examples of a JSONL file and counts {rows, kept, no_rationale, rationale_incorrect}."""
    if target not in TARGETS:
        raise ConfigError(f"target {target!r} is not one of {', '.join(TARGETS)}")
    counts = {"rows": 0, "kept": 0, "no_rationale": 0, "rationale_incorrect": 0}
    examples = []
    for number, line in enumerate(read_data_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question, answer = str(row["question"]).strip(), str(row["answer"]).strip()
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DataError(f"{path} line {number} is not a JSON object with question and answer ({exc})") from exc
        counts["rows"] += 1
        text = _target_text(row, answer, target, counts)
        if text is not None:
            examples.append(SFTExample(str(row.get("id", f"row-{number}")), question, text))
    counts["kept"] = len(examples)
    if not examples:
        raise DataError(f"{path} has no usable rows for target {target!r}; try --target answer")
    return examples, counts


def _target_text(row: dict[str, Any], answer: str, target: str, counts: dict[str, int]) -> str | None:
    if target == "answer":
        return answer
    rationale = row.get("rationale")
    if not rationale:
        counts["no_rationale"] += 1
        return None
    if row.get("rationale_correct") is False:
        counts["rationale_incorrect"] += 1
        return None
    text = _CALCULATOR.sub("", str(rationale)).strip()
    return text if "answer is" in text.lower() else f"{text} The answer is {answer}."
