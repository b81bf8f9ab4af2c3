"""A bridge to lm-evaluation-harness: its tasks (or the user's own task YAMLs) run on an already loaded model.

Background
    lm-evaluation-harness (`lm_eval`) defines thousands of benchmarks as task configs: a data set, a prompt
    template, the request type (log-likelihood of choices, greedy generation, rolling perplexity) and metrics.
    Here the arithmech model handle -- with a fine-tuning delta already applied -- is wrapped in lm-eval's own
    `HFLM(pretrained=<model object>)`, so a harness score is lm-eval's number for exactly the weights the
    other benchmarks see, and nothing is reloaded from the hub.

Per requested task (a task, group or tag name; `run_harness`)
    1. Names are looked up in lm-eval's task index plus `include_path`, a folder of the user's task YAMLs
       (unknown name: one ConfigError sentence with close matches).
    2. `lm_eval.simple_evaluate(tasks=[name], limit, num_fewshot, log_samples=True)` with every lm-eval seed
       (python, numpy, torch, few-shot sampler) set to `seed`: the same seed gives the same numbers. lm-eval
       seeds the global generators; their previous states are restored afterwards. `limit` keeps lm-eval's
       rule: the first `limit` documents of each task, not a random subset.
    3. Written atomically into the harness folder, samples first and the record that marks the task done last:
           samples/<task>.jsonl   one line per document and filter, as lm-eval logs it: doc, target,
                                  arguments (context, continuation or generation settings), resps,
                                  filtered_resps, metric values, hashes -- so every score can be audited
           results.json           per requested name: its fingerprint, seconds, sample files, and lm-eval's
                                  own blocks (results, configs, config, versions, n-shot, n-samples, ...)
       A name whose record holds the same fingerprint (its settings, the model identity, the lm-eval version
       and the text of the task files in `include_path`) and whose sample files are complete is read back
       instead of being run again. Data files are taken as unchanged, as for the built-in benchmarks.

Usage
    >>> options = HarnessOptions(tasks=("arc_easy",), limit=100, seed=0)
    >>> results = run_harness(handle, options, "runs/eval/harness", model_identity={"model": "smollm2"})
    >>> results["arc_easy"].scores[0].value          # acc,none
"""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import json
import math
import random
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arithmech.errors import ConfigError
from arithmech.runs import atomic_open, atomic_write_json

if TYPE_CHECKING:
    from arithmech.models.load import ModelHandle

RESULTS_FILE = "results.json"
SAMPLES_DIR = "samples"
ACCURACY_METRICS = frozenset({"acc", "acc_norm", "exact_match"})
"""Metrics that are a fraction of documents answered correctly, so they fill results.csv's accuracy column."""
_TASK_FILE_SUFFIXES = (".yaml", ".yml", ".py", ".jinja")


@dataclass(frozen=True)
class HarnessOptions:
    """How lm-eval tasks are run (built by the evaluate stage from its config)."""

    tasks: tuple[str, ...]
    include_path: str | None = None
    num_fewshot: int | None = None
    limit: int | None = None
    seed: int = 0
    batch_size: int = 8
    chat_template: bool = False


@dataclass(frozen=True)
class HarnessScore:
    """The main metric of one task or group as lm-eval reports it ("acc,none" = metric acc, filter none)."""

    task: str
    metric: str
    value: float | None
    n: int | None
    accuracy_norm: float | None = None

    @property
    def accuracy(self) -> float | None:
        """The value when the metric is a fraction correct (acc, exact_match), else None."""
        return self.value if self.metric.split(",")[0] in ACCURACY_METRICS else None

    @property
    def correct(self) -> int | None:
        """Documents answered correctly (accuracy x n), to sit beside the built-in benchmarks' counts."""
        return round(self.accuracy * self.n) if self.accuracy is not None and self.n is not None else None


@dataclass
class HarnessResult:
    """One requested lm-eval task, group or tag: its scores, sample files and lm-eval's own output blocks."""

    name: str
    scores: list[HarnessScore]
    samples: dict[str, str]  # leaf task -> its samples file, relative to the harness folder
    lm_eval: dict[str, Any] = field(repr=False)  # results, configs, config, versions, n-shot, n-samples, ...
    seconds: float
    reused: bool = False


def lm_eval_version() -> str:
    """The installed lm-eval version, or one sentence on how to install it."""
    try:
        import lm_eval
    except ImportError:
        raise ConfigError(
            "harness tasks need lm-evaluation-harness, which is not installed; pip install 'arithmech[lm-eval]'"
        ) from None
    return lm_eval.__version__


def task_manager(tasks: Sequence[str], include_path: str | None = None) -> Any:
    """lm-eval's task index for `tasks`, after checking that every name is in it (the config check calls this).

    When `include_path` defines every named task itself, lm-eval's own ~15k task configs are not indexed;
    a group or tag may name built-in tasks, so it always gets the full index.
    """
    lm_eval_version()
    digest = _include_digest(include_path)
    if include_path is not None:
        own = _index(include_path, False, digest)
        if all(name in own.all_subtasks for name in tasks):
            return own
    manager = _index(include_path, True, digest)
    for name in tasks:
        if name not in manager.all_tasks:
            close = difflib.get_close_matches(name, manager.all_tasks, n=5)
            hint = f"close matches: {', '.join(close)}" if close else "`lm-eval ls tasks` lists them"
            raise ConfigError(f"unknown lm-eval task {name!r}; {hint}")
    return manager


@functools.lru_cache(maxsize=4)
def _index(include_path: str | None, include_defaults: bool, digest: str) -> Any:
    """lm-eval's TaskManager, kept: indexing lm-eval's own task configs takes seconds, and the config check and
    the run share it. `digest` (of the task files under include_path) makes an edited folder a new entry."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=include_defaults)


def run_harness(
    handle: ModelHandle,
    options: HarnessOptions,
    out_dir: str | Path,
    model_identity: dict[str, Any],
) -> dict[str, HarnessResult]:
    """Run every task of `options` on `handle` into `out_dir`, reusing finished ones (see the module docstring).

    `model_identity` names the weights (source and checksum) for the fingerprint.
    """
    manager = task_manager(options.tasks, options.include_path)
    out = Path(out_dir)
    version = lm_eval_version()
    included = _include_digest(options.include_path)
    prints = {name: _fingerprint(name, options, model_identity, version, included) for name in options.tasks}
    previous = _read_records(out)
    records = {name: previous[name] for name in options.tasks if _finished(out, previous.get(name), prints[name])}
    _write_records(out, version, records)  # stale records go before any sample file is rewritten
    lm = None
    results: dict[str, HarnessResult] = {}
    for name in options.tasks:
        if name in records:
            results[name] = _result(name, records[name], reused=True)
            continue
        if lm is None:
            lm = _wrap(handle, options.batch_size)
        start = time.perf_counter()
        output = _simple_evaluate(lm, name, options, manager)
        samples = {task: _write_samples(out, task, rows) for task, rows in output.pop("samples").items()}
        records[name] = {"fingerprint": prints[name], "seconds": time.perf_counter() - start, "samples": samples,
                         **_json_safe(output)}  # fmt: skip
        _write_records(out, version, records)
        results[name] = _result(name, records[name], reused=False)
    return results


def _wrap(handle: ModelHandle, batch_size: int) -> Any:
    """lm-eval's HFLM around the loaded model; it gets a copy of the tokenizer, as it may set a pad token."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=handle.model, tokenizer=copy.deepcopy(handle.tokenizer), batch_size=batch_size,
                backend="causal")  # fmt: skip


def _simple_evaluate(lm: Any, name: str, options: HarnessOptions, manager: Any) -> dict[str, Any]:
    from lm_eval import simple_evaluate

    with _restored_global_rng():
        output = simple_evaluate(
            model=lm, tasks=[name], num_fewshot=options.num_fewshot, batch_size=options.batch_size,
            limit=options.limit, log_samples=True, apply_chat_template=options.chat_template,
            task_manager=manager, random_seed=options.seed, numpy_random_seed=options.seed,
            torch_random_seed=options.seed, fewshot_random_seed=options.seed,
        )  # fmt: skip
    assert output is not None, "lm-eval returns no results only on a non-zero rank, and this runs in one process"
    return dict(output)


@contextmanager
def _restored_global_rng() -> Iterator[None]:
    """lm-eval seeds Python's, numpy's and torch's global generators; give the caller's states back afterwards."""
    import numpy as np
    import torch

    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


def _write_samples(out: Path, task: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    relative = f"{SAMPLES_DIR}/{re.sub(r'[^A-Za-z0-9_.-]', '_', task)}.jsonl"
    with atomic_open(out / relative) as handle:
        for row in rows:
            handle.write(json.dumps(_json_safe(row), ensure_ascii=False, allow_nan=False) + "\n")
    return {"file": relative, "lines": len(rows)}


def _read_records(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / RESULTS_FILE).read_text(encoding="utf-8"))["tasks"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return {}


def _write_records(out: Path, version: str, records: dict[str, Any]) -> None:
    atomic_write_json(out / RESULTS_FILE, {"lm_eval_version": version, "tasks": records})


def _finished(out: Path, record: Any, fingerprint: str) -> bool:
    """Whether `record` was made with `fingerprint` and each of its sample files has all its lines."""
    if not isinstance(record, dict) or record.get("fingerprint") != fingerprint:
        return False
    try:
        for sample in record["samples"].values():
            lines = (out / sample["file"]).read_text(encoding="utf-8").splitlines()
            if len([line for line in lines if line]) != sample["lines"]:
                return False
        return "results" in record
    except (OSError, KeyError, TypeError, AttributeError):
        return False


def _result(name: str, record: dict[str, Any], reused: bool) -> HarnessResult:
    blocks = {k: v for k, v in record.items() if k not in ("fingerprint", "seconds", "samples")}
    samples = {task: sample["file"] for task, sample in record["samples"].items()}
    return HarnessResult(name, main_scores(blocks), samples, blocks, record["seconds"], reused)


def main_scores(output: dict[str, Any]) -> list[HarnessScore]:
    """The main metric of each task and group in lm-eval's `results` block: its first "metric,filter" entry
    (the task config's first metric and first filter); groups without an aggregate metric are left out."""
    counts = {task: n.get("effective") for task, n in output.get("n-samples", {}).items()}
    children = output.get("group_subtasks", {})

    def count(task: str) -> int | None:
        if task in counts:
            return counts[task]
        parts = [count(child) for child in children.get(task, [])]
        known = [part for part in parts if part is not None]
        return sum(known) if parts and len(known) == len(parts) else None

    found = []
    for task, block in output.get("results", {}).items():
        keys = [k for k in block if "," in k and "_stderr," not in k]
        if not keys:
            continue
        metric = keys[0]
        norm = f"acc_norm,{metric.split(',', 1)[1]}" if metric.startswith("acc,") else None
        found.append(HarnessScore(task, metric, _number(block[metric]), count(task), _number(block.get(norm))))
    return found


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _fingerprint(name: str, options: HarnessOptions, model: dict[str, Any], version: str, included: str) -> str:
    settings = {k: v for k, v in asdict(options).items() if k != "tasks"}
    payload = {"task": name, "settings": settings, "model": model, "lm_eval": version, "include_files": included}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _include_digest(include_path: str | None) -> str:
    """A checksum of the task definitions (YAML, Python, Jinja) under `include_path`, so an edited task reruns."""
    digest = hashlib.sha256()
    if include_path is not None:
        root = Path(include_path)
        for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _TASK_FILE_SUFFIXES):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _json_safe(value: Any) -> Any:
    """lm-eval output as plain JSON: tuples become lists, numpy/torch values numbers, NaN and inf null, and
    anything else (functions in task configs, dtypes) its str."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if callable(getattr(value, "tolist", None)):  # numpy and torch scalars and arrays
        return _json_safe(value.tolist())
    return str(value)
