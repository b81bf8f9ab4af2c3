"""Fixtures for the finetune tests: a small SFT data file, handles of tiny saved models, a fake identify run."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arithmech.data import PromptPair, write_prompt_file
from arithmech.models.load import ModelConfig, ModelHandle, load_model


@pytest.fixture(autouse=True)
def _single_thread(one_thread: None) -> None:
    """Every finetune test runs on one thread (tests/conftest.py `one_thread`)."""


@pytest.fixture(scope="session")
def sft_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 short word problems with rationales (two marked incorrect, one without a rationale)."""
    rows = []
    for i in range(35):
        a, b = i % 7 + 1, i % 5 + 2
        row: dict[str, Any] = {
            "id": f"toy-{i:03d}",
            "question": f"Tom has {a} apples and buys {b} more. How many now?",
            "answer": str(a + b),
            "rationale": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}.",
            "rationale_correct": True,
        }
        if i in (3, 4):
            row["rationale_correct"] = False
        if i == 5:
            row["rationale"] = None
        rows.append(row)
    path = tmp_path_factory.mktemp("sft") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def handle_of(tiny_model_dir: Callable[[str], Path]) -> Callable[[str], ModelHandle]:
    """A fresh handle (model + tiny tokenizer) of a saved tiny model, eager attention, on the CPU."""

    def load(arch: str) -> ModelHandle:
        return load_model(ModelConfig(model=str(tiny_model_dir(arch))))

    return load


@pytest.fixture
def fake_identify_run(tmp_path: Path) -> Callable[[ModelHandle, dict[str, float]], Path]:
    """Factory: a finished identify run folder with the given effects, as `read_identify_run` reads it."""

    def write(handle: ModelHandle, effects: dict[str, float]) -> Path:
        return _write_identify_run(tmp_path / "identify", handle, effects)

    return write


def _write_identify_run(path: Path, handle: ModelHandle, effects: dict[str, float]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with (path / "effects.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["component", "effect"])
        writer.writerows(effects.items())
    (path / "key_components.json").write_text(json.dumps({"top_k": list(effects)}))
    write_prompt_file(path / "prompts.jsonl", [PromptPair("1 + 2 = ", "1 @ 2 = ", "3")])
    metadata = {"stage": "identify", "model": handle.source, "dims": {"n_heads": handle.dims.n_heads}}
    (path / "metadata.json").write_text(json.dumps(metadata))
    return path
