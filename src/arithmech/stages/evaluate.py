"""The evaluate stage: math and general benchmarks of Zhang et al. (2024, Table 1), with per-example records.

Runs `evaluate.runner.evaluate_benchmark` for each benchmark and writes, atomically, into the run folder:

    examples/<benchmark>.jsonl         one record per example (question, generated text, extracted answer, gold,
                                       correct; choice log-likelihoods; per-text NLL and KL) -- see runner.py
    examples/<benchmark>.summary.json  the benchmark's score, how its rows were chosen (data file and sha256,
                                       rows excluded for train overlap, n_shot, a full example prompt) and the
                                       fingerprint of the config and model that produced it
    results.csv                        one row per benchmark: n, correct, accuracy, accuracy_norm (choice),
                                       perplexity, base_perplexity, kl (general), excluded rows, seconds
    arithmetic.csv, split.json         with arithmetic benchmarks: per benchmark, operation and (operation,
                                       formation), first-token accuracy and exact match with Wilson 95%
                                       intervals; and the train/test split they were drawn from
                                       (data/arithmetic_split.py)
    harness/                           lm-evaluation-harness tasks (--harness-tasks): results.json and
                                       samples/<task>.jsonl -- see evaluate/harness.py
    metadata.json                      model(s), the finetune delta applied (if any), dims, config, per-benchmark
                                       summaries, timings, versions, git sha;
                                       written last

results.csv also has one row per harness task (and group): benchmark "harness:<task>", kind "harness", the
task's main metric ("acc,none") and its value in `metric` and `score`, and, when that metric is a fraction
correct (acc, exact_match), `accuracy` and `correct` as for the built-in benchmarks.

Resuming: a benchmark whose summary holds the same fingerprint (every config field that changes its numbers,
the benchmark name, and the model's identity: its source and a checksum of its weights) is read back instead
of being run again, so an interrupted or extended run (more benchmarks) redoes only what is missing. Data files
are taken as unchanged between runs (their sha256 is recorded in the summary, not compared). Harness tasks
resume the same way from their own record (harness/results.json).

Usage
    >>> cfg = EvaluateConfig(benchmarks=("gsm8k", "mmlu"), limit=100)
    >>> result = evaluate_stage(handle, cfg, "runs/eval")
    >>> result.benchmarks["gsm8k"].accuracy
    >>> evaluate_stage(handle, EvaluateConfig(harness_tasks=("arc_easy",)), "runs/eval").harness["arc_easy"].scores
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from arithmech.data.arithmetic_split import make_split
from arithmech.data.locate import is_jsonl_path
from arithmech.evaluate.arithmetic import GROUP_COLUMNS
from arithmech.evaluate.benchmarks import GENERAL
from arithmech.evaluate.harness import HarnessResult, lm_eval_version, run_harness
from arithmech.evaluate.runner import BenchmarkResult, EvalResult, evaluate_benchmark
from arithmech.models.load import ModelHandle, load_model
from arithmech.models.model_config import ModelConfig
from arithmech.runs import atomic_open, atomic_write_json, atomic_write_text, cell, csv_text, git_sha, package_versions
from arithmech.stages.evaluate_config import EvaluateConfig

logger = logging.getLogger(__name__)

_HARNESS_FIELDS = ("harness_tasks", "harness_include_path", "harness_num_fewshot")
# the base model enters through its own fingerprint; harness tasks have their own (evaluate/harness.py); batch_size
# cuts the same work into other passes (a --max-memory may lower it) and changes no number
_NOT_IN_FINGERPRINT = ("benchmarks", "base_model", "allow_split_mismatch", "batch_size", *_HARNESS_FIELDS)
RESULT_COLUMNS = (
    "benchmark",
    "kind",
    "n",
    "correct",
    "accuracy",
    "accuracy_norm",
    "perplexity",
    "base_perplexity",
    "kl",
    "excluded",
    "seconds",
    "metric",
    "score",
)


FINGERPRINT_CHUNK = 1 << 20
"""Elements summed at a time: a float64 copy of a whole 128k-vocabulary embedding would take 4 GiB (two, with |w|)."""


def model_fingerprint(model: Any) -> str:
    """A checksum of a model's weights (name, shape, sum and sum of |w| per tensor), to tell checkpoints apart."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            t = tensor.detach()
            total = magnitude = 0.0
            if t.is_floating_point():
                for chunk in t.reshape(-1).split(FINGERPRINT_CHUNK):
                    wide = chunk.double()
                    total += float(wide.sum())
                    magnitude += float(wide.abs_().sum())
            digest.update(f"{name}{tuple(t.shape)}{total:.10e}{magnitude:.10e}".encode())
    return digest.hexdigest()


def file_stem(name: str) -> str:
    """A file name for a benchmark: the name itself, or for a .jsonl(.gz) path its stem plus a short hash."""
    if not is_jsonl_path(name):
        return name
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(name.removesuffix(".gz")).stem)
    return f"{stem}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _fingerprint(name: str, cfg: EvaluateConfig, model: dict[str, Any], base: dict[str, Any] | None) -> str:
    settings = {k: v for k, v in asdict(cfg).items() if k not in _NOT_IN_FINGERPRINT}
    payload = {"benchmark": name, "config": settings, "model": model, "base_model": base if name == GENERAL else None}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _identity(handle: ModelHandle) -> dict[str, Any]:
    keys = ("model", "gguf_sha256", "revision", "dtype", "device")
    return {**{k: handle.source.get(k) for k in keys}, "weights": model_fingerprint(handle.model)}


def _summary(result: BenchmarkResult) -> dict[str, Any]:
    return {k: v for k, v in asdict(result).items() if k != "records"}


def _reuse(examples: Path, stem: str, fingerprint: str) -> BenchmarkResult | None:
    """A finished benchmark's result, if its files exist and were made with the same fingerprint."""
    summary_path, records_path = examples / f"{stem}.summary.json", examples / f"{stem}.jsonl"
    if not (summary_path.is_file() and records_path.is_file()):
        return None
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        if summary.get("fingerprint") != fingerprint:
            return None
        records = [json.loads(line) for line in records_path.read_text(encoding="utf-8").splitlines() if line]
        result = BenchmarkResult(**summary["result"], records=records)
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None
    return result if len(records) == result.n else None


def _write_benchmark(examples: Path, stem: str, fingerprint: str, result: BenchmarkResult) -> None:
    """Records first, then the summary that marks the benchmark finished."""
    with atomic_open(examples / f"{stem}.jsonl") as handle:
        for record in result.records:
            handle.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    atomic_write_json(examples / f"{stem}.summary.json", {"fingerprint": fingerprint, "result": _summary(result)})


def _load_base(handle: ModelHandle, name: str, quiet: bool) -> ModelHandle:
    model = None if name == "default" else name
    return load_model(
        ModelConfig(
            model=model, device=handle.source.get("device", "cpu"), dtype=handle.source.get("dtype", "float32")
        ),
        quiet=quiet,
    )


@torch.no_grad()
def evaluate_stage(
    handle: ModelHandle,
    cfg: EvaluateConfig,
    out_dir: str | Path,
    quiet: bool = False,
    base_handle: ModelHandle | None = None,
    delta: dict[str, Any] | None = None,
) -> EvalResult:
    """Score every benchmark of `cfg` and write the run folder (see the module docstring); `delta` is the
    record (`finetune.delta.delta_record`) of a finetune delta applied to the model, kept in metadata.json."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    examples = out / "examples"
    start = time.perf_counter()
    harness = cfg.harness_options()
    if base_handle is None and cfg.base_model and GENERAL in cfg.benchmarks:
        base_handle = _load_base(handle, cfg.base_model, quiet)
    identity = _identity(handle)
    base_identity = _identity(base_handle) if base_handle is not None else None
    options = cfg.options()
    results: dict[str, BenchmarkResult] = {}
    reused: list[str] = []
    (out / "metadata.json").unlink(missing_ok=True)
    for name in cfg.benchmarks:
        stem = file_stem(name)
        fingerprint = _fingerprint(name, cfg, identity, base_identity)
        previous = _reuse(examples, stem, fingerprint)
        if previous is not None:
            logger.info("reusing the finished %s results in %s", name, examples)
            results[name] = previous
            reused.append(name)
            continue
        with tqdm(desc=name, unit="row", disable=quiet) as bar:  # the benchmark sets the total it counts
            result = evaluate_benchmark(handle, name, options, base_handle, bar)
        _write_benchmark(examples, stem, fingerprint, result)
        results[name] = result
    harness_results = run_harness(handle, harness, out / "harness", identity) if harness.tasks else {}
    atomic_write_text(out / "results.csv", results_csv(results.values(), harness_results.values()))
    arithmetic = [r for r in results.values() if r.kind == "arithmetic"]
    if arithmetic:
        atomic_write_text(out / "arithmetic.csv", csv_text([g for r in arithmetic for g in r.info["groups"]],
                                                           GROUP_COLUMNS, ".6f"))  # fmt: skip
        atomic_write_json(out / "split.json", make_split(cfg.split_seed).record())
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "model_weights_sha256": identity["weights"],
        "base_model": base_handle.source if base_handle is not None else None,
        "delta": delta,
        "dims": asdict(handle.dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "benchmarks": {
            name: {**_summary(r), "file": f"examples/{file_stem(name)}.jsonl", "reused": name in reused}
            for name, r in results.items()
        },
        "harness": {name: _harness_summary(r) for name, r in harness_results.items()},
        "timings": {
            "evaluate_s": time.perf_counter() - start,
            **{f"{name}_s": r.seconds for name, r in results.items()},
            **{f"harness:{name}_s": r.seconds for name, r in harness_results.items()},
        },
        "versions": {**package_versions(), **({"lm_eval": lm_eval_version()} if harness.tasks else {})},
        "identify_runs": [],  # it reads no identify run, so no rerun of one makes it stale
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(out / "metadata.json", metadata)
    return EvalResult(results, harness_results)


def _harness_summary(result: HarnessResult) -> dict[str, Any]:
    return {"scores": [{**asdict(s), "accuracy": s.accuracy, "correct": s.correct} for s in result.scores],
            "results": "harness/results.json", "samples": {t: f"harness/{f}" for t, f in result.samples.items()},
            "seconds": result.seconds, "reused": result.reused}  # fmt: skip


def results_csv(results: Any, harness: Any = ()) -> str:
    """results.csv text: one row per benchmark, then per harness task (empty cells where a column does not apply)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(RESULT_COLUMNS)
    rows = []
    for r in results:
        excluded = len(r.info.get("excluded_by_id", [])) + len(r.info.get("excluded_by_text", []))
        rows.append([r.name, r.kind, r.n, r.correct, r.accuracy, r.accuracy_norm, r.info.get("perplexity"),
                     r.info.get("base_perplexity"), r.info.get("kl"), excluded, r.seconds, None, None])  # fmt: skip
    for result in harness:
        for s in result.scores:
            rows.append([f"harness:{s.task}", "harness", s.n, s.correct, s.accuracy, s.accuracy_norm, None, None,
                         None, None, result.seconds, s.metric, s.value])  # fmt: skip
    for cells in rows:
        writer.writerow([cell(c, ".6f") if c is None or isinstance(c, float) else c for c in cells])
    return buffer.getvalue()
