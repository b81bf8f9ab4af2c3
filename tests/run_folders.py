"""Checks of run folders after a failure, and the faults that cause one, for the reliability tests.

`Faults` counts two kinds of events while a stage runs and can raise at the Nth of either:
    forward   a forward pass reaching a decoder layer (a pre-hook on the layer given): the middle of the compute;
    write     an fsync inside `runs.atomic_open`, i.e. a file about to be renamed into place (os.fsync is
              patched; nothing else in a stage calls it): the middle of saving chunks or results.
A first, fault-free run counts the events, so a test can choose N as "half way" without knowing the stage.

`check_intact(folder)` asserts that nothing is half-written: no temporary file is left and every file parses
(CSV rows as wide as their header, JSON, JSONL, PNG up to its IEND chunk, SVG as XML, torch and safetensors
files load). `results(folder)` is what must be identical between two runs: every CSV, JSON and JSONL file
parsed, with the keys that record when or how long (or whether a stage resumed) left out, and the bytes of
tensor files; `assert_close_results` the same within a tolerance (a run whose work was cut into other batches).
`nonfinite(folder)` lists every number in a CSV or JSON(L) file that is NaN, infinite, or a cell
of a numeric column that is empty or not a number, apart from the documented exceptions below.
"""

from __future__ import annotations

import csv
import json
import math
import os
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

VOLATILE = frozenset({
    "timings", "created", "seconds", "finished", "resumed", "reused", "resumed_from_step", "samples_per_second",
    "train_seconds", "peak_memory", "memory_budget",
})  # fmt: skip
"""Keys (JSON) and columns (CSV) that say when, how fast, or whether reused, or how much memory was free (the
default budget, metadata.json's memory_budget): they may differ between runs."""

_PNG_END = b"IEND\xaeB`\x82"


class Faults:
    """Counts forward passes and atomic writes; raises `error()` at the chosen one of either kind."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, layer: nn.Module | None = None) -> None:
        self.counts = {"forward": 0, "write": 0}
        self.fail_at: dict[str, int] = {}
        self.error: Any = KeyboardInterrupt
        self.fired: str | None = None
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            self._tick("write")
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        self._layer = layer

    def _tick(self, kind: str) -> None:
        self.counts[kind] += 1
        if self.fail_at.get(kind) == self.counts[kind]:
            self.fired = kind
            raise self.error()

    @contextmanager
    def armed(self, kind: str | None = None, n: int = 0, error: Any = KeyboardInterrupt) -> Iterator[None]:
        """Count (and with `kind`, raise `error()` at its nth event) inside the block."""
        self.counts = {"forward": 0, "write": 0}
        self.fail_at = {kind: n} if kind else {}
        self.error, self.fired = error, None
        hook = None if self._layer is None else self._layer.register_forward_pre_hook(lambda *_: self._tick("forward"))
        try:
            yield
        finally:
            if hook is not None:
                hook.remove()
            self.fail_at = {}


def check_intact(folder: Path) -> list[Path]:
    """Assert no temporary file is left under `folder` and every file parses; return the files."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    assert not [p for p in folder.rglob("*") if p.name.endswith(".tmp")], "temporary files left"
    for path in files:
        hidden = [part for part in path.relative_to(folder).parts if part.startswith(".")]
        assert hidden in ([], [".partial"]), f"unexpected hidden file {path}"
        _parse(path)
    return files


def _parse(path: Path) -> Any:
    suffix = path.suffix
    if suffix == ".csv":
        with path.open(newline="") as handle:
            rows = list(csv.reader(handle))
        assert rows and all(len(row) == len(rows[0]) for row in rows), f"ragged or empty CSV {path}"
        return rows
    if suffix == ".json":
        return json.loads(path.read_text())
    if suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    if suffix == ".png":
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") and data.endswith(_PNG_END), f"truncated PNG {path}"
        return None
    if suffix == ".svg":
        return ElementTree.parse(path)
    if suffix == ".pt":
        return torch.load(path, weights_only=False)
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return path.read_bytes()


def _drop_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_volatile(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_drop_volatile(v) for v in value]
    return value


def results(folder: Path) -> dict[str, Any]:
    """{relative path: content to compare} of every result file (figures are only checked to be intact)."""
    out: dict[str, Any] = {}
    for path in check_intact(folder):
        name = str(path.relative_to(folder))
        if path.suffix == ".csv":
            with path.open(newline="") as handle:
                out[name] = [_drop_volatile(row) for row in csv.DictReader(handle)]
        elif path.suffix in (".json", ".jsonl"):
            out[name] = _drop_volatile(_parse(path))
        elif path.suffix in (".safetensors", ".pt"):
            out[name] = path.read_bytes()
        else:
            out[name] = "figure" if path.suffix in (".png", ".svg") else path.read_bytes()
    return out


def assert_same_results(got: Path, expected: Path) -> None:
    """The two folders hold the same files with the same numbers (see `results`)."""
    a, b = results(got), results(expected)
    assert sorted(a) == sorted(b)
    for name in b:
        assert a[name] == b[name], name


def assert_close_results(
    got: Path,
    expected: Path,
    tol: float,
    skip: tuple[str, ...] = ("metadata.json",),
    looser: dict[str, float] | None = None,
) -> None:
    """The two folders hold the same files, and every number (CSV cell, JSON value, tensor entry) of one is within
    `tol` of the other's, absolutely or relative to its size; text is equal. Files named in `skip` are left out.
    `looser` gives a JSON key (at any depth) its own tolerance: a ratio of small differences amplifies the float32
    noise of its inputs by their inverse."""
    a, b = results(got), results(expected)
    assert sorted(a) == sorted(b)
    for name in b:
        if Path(name).name in skip:
            continue
        if name.endswith((".safetensors", ".pt")):
            x, y = _parse(got / name), _parse(expected / name)
            assert sorted(x) == sorted(y), name
            for key in y:
                assert torch.allclose(x[key], y[key], rtol=tol, atol=tol), f"{name}: {key}"
        else:
            _assert_close(a[name], b[name], tol, name, looser or {})


def _assert_close(x: Any, y: Any, tol: float, where: str, looser: dict[str, float]) -> None:
    if isinstance(x, dict) and isinstance(y, dict):
        assert sorted(x) == sorted(y), where
        for key in y:
            _assert_close(x[key], y[key], looser.get(key, tol), f"{where}: {key}", looser)
    elif isinstance(x, list) and isinstance(y, list):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            _assert_close(u, v, tol, f"{where}[{i}]", looser)
    elif x != y:
        u, v = _number(x), _number(y)
        assert u is not None and v is not None, f"{where}: {x!r} != {y!r}"
        assert abs(u - v) <= tol * max(1.0, abs(v)), f"{where}: {x!r} != {y!r}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


TEXT_COLUMNS = frozenset({
    "benchmark", "class", "component", "components", "filter", "head", "intervention", "kind", "label", "level",
    "method_a", "method_b", "metric", "neuron", "note", "operation", "promoted_tokens", "prompts", "ranking",
    "removed_frequencies", "site", "source", "source_set", "target", "task", "task_a", "task_b", "template_id",
    "token", "top_tokens",
    "high_frequencies",  # fourier_shares.csv: "3-5"
    "method", "edge", "chosen",  # circuit: faithfulness.csv, cpr_cmd.csv (a ranking), oracle.csv
    "pairs", "draw", "cpr_ranking", "cmd_ranking", "seeds",  # circuit: held-out or in-sample; "seed 1"; "0 1 2"
    "prompt_set",  # knockout: held_out, in_sample or unranked
    "ablation", "selection",  # heuristics: ablation.csv; neurons.csv and patterns.csv per template family:
    "operand_template", "operand_family", "operand_direction", "result_template", "result_family", "result_direction",
    "variable", "family", "periods", "reason",  # analyze numbers: numbers_ld.csv ("a", "helix-5-10", "5 10", why not)
    "classified_on",  # analyze numbers: numbers_clock_heads.csv ("heldout" or "train")
})  # fmt: skip
"""CSV columns of names and text (a head "0.1", a neuron "1_37" and a digit token "7" parse as numbers, but
are names); every other column holds numbers."""

MAY_BE_EMPTY = frozenset({
    "seed",  # knockout.csv: only the random-rank rows have a draw seed; the baseline and effect-ranked rows none
    "accuracy", "correct",  # evaluate results.csv: the general-text row has no answers to score
    "accuracy_norm",  # evaluate: choice benchmarks only
    "perplexity", "base_perplexity", "kl",  # evaluate: the general-text row only; base and KL for a tuned model
    "score",  # evaluate: lm-evaluation-harness rows only
    "effect_drop", "random_drop",  # transfer.csv: drops relative to the unablated accuracy, undefined where it is 0
    "top5_overlap", "top10_overlap", "top20_overlap",  # agreement.csv: undefined where fewer sites than k are ranked
    "high_share", "random_mean", "random_std",  # fourier_shares.csv: undefined where a group writes no power
    "random_accuracy_std", "random_prob_std",  # knockout, transfer: a sample sd, undefined with one random draw
    "effect_std",  # effects.csv, effects_by_position.csv: a sample sd, undefined for one prompt
    "cpr_sd", "cpr_min", "cpr_max", "cmd_sd", "cmd_min", "cmd_max",  # cpr_cmd.csv: the random ranking's spread only
    # numbers_ld.csv: the whole-layer row has no fit, PCA no shuffled control, a cell without held-out pairs no
    # held-out LD, a cell not estimable (its reason column says why) no restored share
    "dim", "rank", "r2", "r2_shuffled", "ld_other", "ld_shuffled", "restored", "restored_shuffled",
    "restored_shuffled_sd", "ld_heldout", "ld_shuffled_heldout", "restored_heldout", "restored_shuffled_heldout",
    "ld_layer_heldout", "ld_ablated", "ablation_lost", "ld_random", "random_lost",
    # numbers_clock_heads.csv: a head whose whole effect is too small (reason) has no shares
    "c_ab", "c_sum", "c_joint", "c_ab_heldout", "c_sum_heldout", "c_joint_heldout", "head_share", "identify_effect",
})  # fmt: skip
"""Numeric CSV columns whose cell may be empty: the quantity does not apply to that row, or is undefined there
(an undefined number is written as an empty cell or a JSON null, never NaN: `runs.py`). JSON null means "not
set", "does not apply" or "undefined" and is not checked; any NaN or Infinity, in a CSV cell or JSON, is."""


def _number_problem(value: str) -> str | None:
    try:
        number = float(value)
    except ValueError:
        return "not a number"
    return None if math.isfinite(number) else "not finite"


def _json_nonfinite(value: Any, where: str, key: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_nonfinite(v, where, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _json_nonfinite(v, where, key)
    elif isinstance(value, float) and not math.isfinite(value):
        yield f"{where} {key!r}: {value}"


def nonfinite(folder: Path) -> list[str]:
    """'file column/key: value (why)' of each number under `folder` that is missing or not finite (see above)."""
    problems: list[str] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = str(path.relative_to(folder))
        if path.suffix == ".csv":
            with path.open(newline="") as handle:
                for line, row in enumerate(csv.DictReader(handle), start=2):
                    for column, value in row.items():
                        if column in TEXT_COLUMNS or (value == "" and column in MAY_BE_EMPTY):
                            continue
                        why = _number_problem(value or "")
                        if why:
                            problems.append(f"{name}:{line} {column}: {value!r} ({why})")
        elif path.suffix in (".json", ".jsonl"):
            problems += list(_json_nonfinite(_parse(path), name))
    return problems
