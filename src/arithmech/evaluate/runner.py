"""Evaluate a model on named benchmarks: rows -> subset -> prompts -> generation or choice scores -> records.

Per benchmark (`evaluate_benchmark`)
    1. Rows from the data roots, a .jsonl path or the hub (`loading.py`); with exclude_train_overlap, rows
       seen in training are dropped first (by orig_id and by normalised question text; counts recorded).
    2. Subset: with `limit`, `limit` rows drawn by a local random.Random(f"{seed}:{name}") and kept in file
       order; the same seed and data give the same rows, and no global random state is touched.
    3. Prompts (`benchmarks.build_prompts`), then
       generate   greedy continuations (`generation.py`), final number extracted, |pred - gold| < 1e-4;
       choice     log-likelihood of each option (`choice.py`); accuracy by summed LL and accuracy_norm by
                  per-character LL;
       general    perplexity on plain text, and KL(base || tuned) when a base model is given (`general.py`);
       arithmetic prompts of the leakage-free split (or the multi-digit transfer set) instead of rows; first
                  answer token, exact number and answer tokens right in one teacher-forced pass; the accuracy
                  is of whole numbers where answers have several tokens (`arithmetic.py` `headline`).
    4. One record per example, so that every number can be audited:
       generate   id, question, gold, generated (cut at the stop string), extracted, correct, stopped,
                  n_tokens, truncated (+ orig_id / source where the data have them)
       choice     id, subject, question, choices, gold, logprobs, n_tokens, predicted, predicted_norm,
                  correct, correct_norm
       general    id, n_tokens, nll, base_nll, kl
       arithmetic id, template_id, operation, formation, a, b, gold, predicted (first token), correct (first
                  token), exact, logprob, n_answer_tokens, tokens_correct, part, examples (the solved
                  examples' operands)
    The full prompt is not repeated per record: `info["prompt_example"]` holds the first one.

Usage
    >>> result = evaluate(handle, ["gsm8k", "mmlu"], limit=50, seed=0, max_new_tokens=256)
    >>> result.benchmarks["gsm8k"].accuracy
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from arithmech.data.arithmetic_split import make_split
from arithmech.data.locate import is_jsonl_path
from arithmech.errors import DataError
from arithmech.evaluate.answers import choice_letter, extract_number, format_number, numbers_match
from arithmech.evaluate.arithmetic import arithmetic_prompts, arithmetic_records, group_rows, headline
from arithmech.evaluate.benchmarks import Benchmark, benchmark, build_prompts, resolve_shots, stop_strings
from arithmech.evaluate.choice import predict, score_choices
from arithmech.evaluate.general import general_scores
from arithmech.evaluate.general_texts import load_general_texts
from arithmech.evaluate.generation import generate_greedy
from arithmech.evaluate.harness import HarnessResult
from arithmech.evaluate.loading import EvalItem, choice_items, load_rows, math_items, train_overlap
from arithmech.models.load import ModelHandle
from arithmech.progress import Progress


@dataclass(frozen=True)
class EvalOptions:
    """How benchmarks are run (the evaluate stage's config, less the benchmark list)."""

    limit: int | None = None
    seed: int = 0
    batch_size: int = 8
    max_new_tokens: int = 256
    n_shot: int | None = None
    choice_format: str | None = None
    chat_template: bool = False
    exclude_train_overlap: bool = False
    train_file: str | None = None
    data_dir: str | None = None
    general_text: str | None = None
    general_max_tokens: int = 512
    split_seed: int = 0
    arithmetic_part: str = "test"


@dataclass
class BenchmarkResult:
    """One benchmark's score, its per-example records, and how its rows were chosen (`info`)."""

    name: str
    kind: str
    n: int
    correct: int | None
    accuracy: float | None
    accuracy_norm: float | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class EvalResult:
    """Each built-in benchmark's result by name, and each lm-evaluation-harness task's by its requested name."""

    benchmarks: dict[str, BenchmarkResult]
    harness: dict[str, HarnessResult] = field(default_factory=dict)


def select_subset(items: Sequence[Any], limit: int | None, seed: int, name: str) -> list[Any]:
    """`limit` items drawn with a local RNG seeded by (seed, name), in their original order; all if no limit."""
    if limit is None or limit >= len(items):
        return list(items)
    rng = random.Random(f"{seed}:{name}")
    return [items[i] for i in sorted(rng.sample(range(len(items)), limit))]


def load_items(bench: Benchmark, options: EvalOptions) -> tuple[list[EvalItem], list[EvalItem], dict[str, Any]]:
    """(items to evaluate, few-shot exemplar items, info) of a benchmark, after overlap exclusion and subset."""
    assert bench.data is not None
    loaded = load_rows(bench.data, options.data_dir, bench.hub)
    info: dict[str, Any] = {"data": loaded.origin, "data_from": loaded.found_in, "data_sha256": loaded.sha256,
                            "rows_in_file": len(loaded.rows)}
    if bench.kind == "generate":
        items = math_items(loaded.rows, loaded.origin, bench.source)
    else:
        items = choice_items(loaded.rows, loaded.origin)
    info["rows"] = len(items)
    if options.exclude_train_overlap and bench.kind == "generate":
        overlap = train_overlap(options.train_file, options.data_dir)
        items, excluded = overlap.split(items)
        info.update(train_file=overlap.origin, train_sha256=overlap.sha256,
                    excluded_by_id=excluded["by_id"], excluded_by_text=excluded["by_text"])
        if not items:
            raise DataError(f"every row of {bench.name} overlaps the training file; evaluate on another set")
    info["rows_after_exclusion"] = len(items)
    exemplars: list[EvalItem] = []
    if bench.exemplars and resolve_shots(bench, options.n_shot) > 0:
        ex_rows = load_rows(bench.exemplars, options.data_dir, bench.exemplar_hub)
        exemplars = choice_items(ex_rows.rows, ex_rows.origin)
        info.update(exemplars=ex_rows.origin, exemplars_sha256=ex_rows.sha256)
    subset = select_subset(items, options.limit, options.seed, bench.name)
    return subset, exemplars, info


def evaluate_benchmark(
    handle: ModelHandle,
    name: str,
    options: EvalOptions | None = None,
    base_handle: ModelHandle | None = None,
    progress: Progress | None = None,
) -> BenchmarkResult:
    """Score one benchmark (see the module docstring)."""
    options = options or EvalOptions()
    start = time.perf_counter()
    hint = load_rows(name).rows[:1] if is_jsonl_path(name) else None
    bench = benchmark(name, hint)
    if bench.kind == "general":
        result = _general(handle, bench, options, base_handle, progress)
    elif bench.kind == "arithmetic":
        result = _arithmetic(handle, bench, options, progress)
    else:
        items, exemplars, info = load_items(bench, options)
        chat = handle.tokenizer if options.chat_template else None
        prompts = build_prompts(bench, items, options.n_shot, options.choice_format, exemplars, chat)
        info.update(n_shot=resolve_shots(bench, options.n_shot), chat_template=options.chat_template,
                    prompt_example=prompts[0].text if prompts else None)
        if bench.kind == "generate":
            result = _generate(handle, bench, prompts, options, progress)
        else:
            info["choice_format"] = options.choice_format or bench.choice_format
            result = _choice(handle, bench, prompts, options, progress)
        result.info = {**info, **result.info}
    result.seconds = time.perf_counter() - start
    return result


def _generate(
    handle: ModelHandle, bench: Benchmark, prompts: list[Any], options: EvalOptions, progress: Progress | None
) -> BenchmarkResult:
    outs = generate_greedy(
        handle.model, handle.tokenizer, [p.text for p in prompts], options.max_new_tokens, options.batch_size,
        stop_strings(options.chat_template), add_special_tokens=not options.chat_template, progress=progress,
    )
    records = []
    for prompt, out in zip(prompts, outs, strict=True):
        item = prompt.item
        value = extract_number(out.text)
        records.append({
            "id": item.id, "question": item.question, "gold": item.answer, "generated": out.text,
            "extracted": format_number(value), "correct": numbers_match(value, str(item.answer)),
            "stopped": out.stopped, "n_tokens": out.n_tokens, "truncated": out.truncated, **item.extra,
        })
    correct = sum(r["correct"] for r in records)
    info = {"max_new_tokens": options.max_new_tokens, "truncated_prompts": sum(o.truncated for o in outs),
            "not_stopped": sum(not o.stopped for o in outs)}
    return BenchmarkResult(bench.name, bench.kind, len(records), correct, _share(correct, len(records)),
                           records=records, info=info)


def _choice(
    handle: ModelHandle, bench: Benchmark, prompts: list[Any], options: EvalOptions, progress: Progress | None
) -> BenchmarkResult:
    scores = score_choices(
        handle.view, handle.tokenizer, [p.text for p in prompts], [p.continuations for p in prompts],
        options.batch_size, add_special_tokens=not options.chat_template, progress=progress,
    )
    records = []
    for prompt, row in zip(prompts, scores, strict=True):
        item = prompt.item
        best, best_norm = predict(row), predict(row, normalize=True)
        records.append({
            "id": item.id, "subject": item.subject, "question": item.question, "choices": list(item.choices),
            "gold": item.answer, "gold_letter": choice_letter(int(item.answer)),
            "logprobs": [s.logprob for s in row], "n_tokens": [s.n_tokens for s in row],
            "predicted": best, "predicted_norm": best_norm,
            "correct": best == item.answer, "correct_norm": best_norm == item.answer,
        })
    n = len(records)
    correct = sum(r["correct"] for r in records)
    return BenchmarkResult(bench.name, bench.kind, n, correct, _share(correct, n),
                           _share(sum(r["correct_norm"] for r in records), n), records=records)


def _general(
    handle: ModelHandle, bench: Benchmark, options: EvalOptions, base: ModelHandle | None, progress: Progress | None
) -> BenchmarkResult:
    texts = select_subset(load_general_texts(options.general_text), options.limit, options.seed, bench.name)
    result = general_scores(
        handle.view, handle.tokenizer, texts, base.view if base else None, base.tokenizer if base else None,
        options.general_max_tokens, options.batch_size, progress,
    )
    records = [{"id": t.id, "n_tokens": t.n_tokens, "nll": t.nll, "base_nll": t.base_nll, "kl": t.kl}
               for t in result.texts]
    info = {"text": options.general_text or "built-in general_text.jsonl", "n_tokens": result.n_tokens,
            "perplexity": result.perplexity, "base_perplexity": result.base_perplexity, "kl": result.kl,
            "base_model": base.source.get("model") if base else None}
    return BenchmarkResult(bench.name, bench.kind, len(records), None, None, records=records, info=info)


def _arithmetic(handle: ModelHandle, bench: Benchmark, options: EvalOptions, progress: Progress | None
                ) -> BenchmarkResult:  # fmt: skip
    assert bench.arithmetic is not None
    split = make_split(options.split_seed)
    shots = resolve_shots(bench, options.n_shot)
    prompts = arithmetic_prompts(split, bench.arithmetic, bench.operations, options.arithmetic_part, shots)
    records = arithmetic_records(handle.view, handle.tokenizer, prompts, options.limit, options.seed,
                                 options.batch_size, progress)  # fmt: skip
    groups = group_rows(bench.name, records)
    scored, correct = headline(records)  # whole numbers when an answer has several tokens
    n = groups[0]["n"]
    info = {"split_seed": split.seed, "split_fingerprint": split.fingerprint, "part": options.arithmetic_part
            if bench.arithmetic == "split" else "transfer", "prompts_in_part": len(prompts), "n_shot": shots,
            "chat_template": False, "prompt_example": prompts[0].reference if prompts else None, "scored": scored,
            "exact_match": groups[0]["exact_accuracy"], "first_token_accuracy": groups[0]["accuracy"],
            "first_token_correct": groups[0]["correct"], "token_accuracy": groups[0]["token_accuracy"],
            "groups": groups}  # fmt: skip
    return BenchmarkResult(bench.name, bench.kind, n, correct, _share(correct, n), records=records, info=info)


def _share(count: int, total: int) -> float | None:
    return count / total if total else None


def evaluate(
    handle: ModelHandle,
    benchmarks: Sequence[str],
    limit: int | None = None,
    seed: int = 0,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    *,
    base_handle: ModelHandle | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> EvalResult:
    """Score every benchmark; `options` are the other `EvalOptions` fields (n_shot, data_dir, ...)."""
    opts = EvalOptions(limit=limit, seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens, **options)
    return EvalResult({name: evaluate_benchmark(handle, name, opts, base_handle, progress) for name in benchmarks})
