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
    metadata.json                      model(s), dims, config, per-benchmark summaries, timings, versions, git sha;
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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from arithmech.data.arithmetic_split import make_split
from arithmech.data.locate import is_jsonl_path
from arithmech.errors import ConfigError
from arithmech.evaluate.arithmetic import GROUP_COLUMNS
from arithmech.evaluate.benchmarks import CHOICE_FORMATS, GENERAL, benchmark_names
from arithmech.evaluate.harness import HarnessOptions, HarnessResult, lm_eval_version, run_harness, task_manager
from arithmech.evaluate.runner import BenchmarkResult, EvalOptions, EvalResult, evaluate_benchmark
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.runs import atomic_open, atomic_write_json, atomic_write_text, csv_text, git_sha, package_versions

logger = logging.getLogger(__name__)

DEFAULT_BENCHMARKS: tuple[str, ...] = ("gsm8k", "svamp", "addsub", "singleeq", "mmlu", "csqa")
_HARNESS_FIELDS = ("harness_tasks", "harness_include_path", "harness_num_fewshot")
# the base model enters through its own fingerprint; harness tasks have their own (evaluate/harness.py)
_NOT_IN_FINGERPRINT = ("benchmarks", "base_model", *_HARNESS_FIELDS)
RESULT_COLUMNS = ("benchmark", "kind", "n", "correct", "accuracy", "accuracy_norm", "perplexity",
                  "base_perplexity", "kl", "excluded", "seconds", "metric", "score")


@dataclass(frozen=True)
class EvaluateConfig:
    """Settings of the evaluate stage."""

    benchmarks: tuple[str, ...] | None = field(
        default=None,
        metadata={"help": "benchmarks: gsm8k, svamp, addsub, singleeq, adapters-<set>, mmlu, csqa, general, "
                          "arithmetic[-<operation>], arithmetic-multidigit[-<operation>], or a .jsonl file; default "
                          "gsm8k,svamp,addsub,singleeq,mmlu,csqa, or none when harness tasks are given"},
    )
    limit: int | None = field(
        default=None, metadata={"help": "rows (texts for general) per benchmark, a seeded subset; all if unset"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the subsets (same seed = same rows)"})
    batch_size: int = field(default=8, metadata={"help": "prompts (or choice rows) per forward pass"})
    max_new_tokens: int = field(default=256, metadata={"help": "longest generated solution (math benchmarks)"})
    n_shot: int | None = field(
        default=None, metadata={"help": "solved examples per prompt; default each benchmark's (math 8, mmlu 5, csqa 0)"}
    )
    choice_format: str | None = field(
        default=None, metadata={"help": "letter or text scoring of choices; default mmlu letter, csqa text"}
    )
    chat_template: bool = field(
        default=False, metadata={"help": "wrap each prompt in the tokenizer's chat template (default: plain few-shot)"}
    )
    exclude_train_overlap: bool = field(
        default=False,
        metadata={"help": "drop math rows seen in training (orig_id or question text of the train file)"},
    )
    train_file: str | None = field(
        default=None, metadata={"help": "training JSONL for the overlap rule; default llm_adapters_math_v1/train"}
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "data folder; else $ARITHMECH_DATA, then the sets shipped with arithmech"}
    )
    general_text: str | None = field(
        default=None, metadata={"help": "text file (paragraphs) or JSONL with text for the general check"}
    )
    general_max_tokens: int = field(default=512, metadata={"help": "tokens kept per general text"})
    base_model: str | None = field(
        default=None,
        metadata={"help": "base model for KL in the general check: hub id, folder, .gguf, or 'default'"},
    )
    split_seed: int = field(
        default=0, metadata={"help": "seed of the arithmetic train/test split; the same as the finetune stage's"}
    )
    arithmetic_part: str = field(
        default="test",
        metadata={"help": "arithmetic benchmarks ask: test (held-out templates and operand pairs) or validation "
                          "(train templates, validation pairs: for choosing hyperparameters)"},
    )  # fmt: skip
    harness_tasks: tuple[str, ...] = field(
        default=(),
        metadata={"help": "lm-evaluation-harness tasks, groups or tags (e.g. arc_easy,hellaswag); needs "
                          "pip install 'arithmech[lm-eval]'; limit takes each task's first rows"},
    )
    harness_include_path: str | None = field(
        default=None, metadata={"help": "folder of your own lm-eval task YAMLs, named in harness_tasks"}
    )
    harness_num_fewshot: int | None = field(
        default=None, metadata={"help": "few-shot examples per harness prompt; default each task's own (else 0)"}
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "harness_tasks", _names(self.harness_tasks))
        default = () if self.harness_tasks else DEFAULT_BENCHMARKS
        object.__setattr__(self, "benchmarks", default if self.benchmarks is None else _names(self.benchmarks))
        if not self.benchmarks and not self.harness_tasks:
            raise ConfigError("no benchmark given; name at least one, e.g. gsm8k,mmlu, or a harness task")
        self._check_harness()
        known = benchmark_names()
        for name in self.benchmarks:
            if name not in known and not is_jsonl_path(name):
                raise ConfigError(f"unknown benchmark {name!r}; use one of {', '.join(known)} or a .jsonl path")
        if len(set(self.benchmarks)) != len(self.benchmarks):
            raise ConfigError(f"benchmark list {', '.join(self.benchmarks)} names one benchmark twice; name it once")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be at least 1, or unset for all rows (got {self.limit})")
        for name in ("batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.general_max_tokens < 2:
            raise ConfigError(f"general_max_tokens must be at least 2 (got {self.general_max_tokens})")
        if self.n_shot is not None and self.n_shot < 0:
            raise ConfigError(f"n_shot must be 0 or more (got {self.n_shot})")
        if self.arithmetic_part not in ("test", "validation"):
            raise ConfigError(f"arithmetic_part {self.arithmetic_part!r} is not test or validation")
        if self.arithmetic_part != "test" and any(n.startswith("arithmetic-multidigit") for n in self.benchmarks):
            raise ConfigError("the multi-digit transfer set is held out for testing only; use arithmetic_part test")
        if self.choice_format is not None and self.choice_format not in CHOICE_FORMATS:
            raise ConfigError(f"choice_format {self.choice_format!r} is not one of {', '.join(CHOICE_FORMATS)}")

    def _check_harness(self) -> None:
        """Cheap checks first, then the names against lm-eval's task index, so a typo fails before a model loads."""
        if len(set(self.harness_tasks)) != len(self.harness_tasks):
            raise ConfigError(f"harness task list {', '.join(self.harness_tasks)} names one task twice; name it once")
        if not self.harness_tasks and (self.harness_include_path or self.harness_num_fewshot is not None):
            raise ConfigError("harness_include_path and harness_num_fewshot apply to harness tasks; name them too, "
                              "e.g. --harness-tasks my_task")  # fmt: skip
        if self.harness_include_path is not None and not Path(self.harness_include_path).is_dir():
            raise ConfigError(f"harness_include_path {self.harness_include_path!r} is not a folder; give the folder "
                              "holding your task YAML files")  # fmt: skip
        if self.harness_num_fewshot is not None and self.harness_num_fewshot < 0:
            raise ConfigError(f"harness_num_fewshot must be 0 or more (got {self.harness_num_fewshot})")
        if self.harness_tasks:
            task_manager(self.harness_tasks, self.harness_include_path)  # lm-eval installed, every name known

    def harness_options(self) -> HarnessOptions:
        """The harness bridge's options: its own fields plus the shared limit, seed, batch size and chat template."""
        return HarnessOptions(tasks=self.harness_tasks, include_path=self.harness_include_path,
                              num_fewshot=self.harness_num_fewshot, limit=self.limit, seed=self.seed,
                              batch_size=self.batch_size, chat_template=self.chat_template)  # fmt: skip

    def options(self) -> EvalOptions:
        """The runner's options (every field but the benchmark list and the base model)."""
        names = {f.name for f in fields(EvalOptions)}
        return EvalOptions(**{k: v for k, v in asdict(self).items() if k in names})


def _names(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A comma list ("a, b") or a sequence of names as a tuple."""
    if isinstance(value, str):
        return tuple(n.strip() for n in value.split(",") if n.strip())
    return tuple(value)


def model_fingerprint(model: Any) -> str:
    """A checksum of a model's weights (name, shape, sum and sum of |w| per tensor), to tell checkpoints apart."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            t = tensor.detach()
            stats = (float(t.double().sum()), float(t.double().abs().sum())) if t.is_floating_point() else (0.0, 0.0)
            digest.update(f"{name}{tuple(t.shape)}{stats[0]:.10e}{stats[1]:.10e}".encode())
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


def _load_base(handle: ModelHandle, name: str) -> ModelHandle:
    model = None if name == "default" else name
    return load_model(ModelConfig(model=model, device=handle.source.get("device", "cpu"),
                                  dtype=handle.source.get("dtype", "float32")))


def evaluate_stage(
    handle: ModelHandle,
    cfg: EvaluateConfig,
    out_dir: str | Path,
    quiet: bool = False,
    base_handle: ModelHandle | None = None,
) -> EvalResult:
    """Score every benchmark of `cfg` and write the run folder (see the module docstring)."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    examples = out / "examples"
    start = time.perf_counter()
    harness = cfg.harness_options()
    if base_handle is None and cfg.base_model and GENERAL in cfg.benchmarks:
        base_handle = _load_base(handle, cfg.base_model)
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
        with tqdm(desc=name, unit="row", disable=quiet) as bar:
            result = evaluate_benchmark(handle, name, options, base_handle, bar.update)
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
        "stage": "evaluate",
        "model": handle.source,
        "model_weights_sha256": identity["weights"],
        "base_model": base_handle.source if base_handle is not None else None,
        "dims": asdict(handle.dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "benchmarks": {name: {**_summary(r), "file": f"examples/{file_stem(name)}.jsonl", "reused": name in reused}
                       for name, r in results.items()},
        "harness": {name: _harness_summary(r) for name, r in harness_results.items()},
        "timings": {"evaluate_s": time.perf_counter() - start,
                    **{f"{name}_s": r.seconds for name, r in results.items()},
                    **{f"harness:{name}_s": r.seconds for name, r in harness_results.items()}},
        "versions": {**package_versions(), **({"lm_eval": lm_eval_version()} if harness.tasks else {})},
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
        writer.writerow(["" if c is None else (f"{c:.6f}" if isinstance(c, float) else c) for c in cells])
    return buffer.getvalue()
