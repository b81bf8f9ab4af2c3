"""Arithmetic as a benchmark: the project's own templates on held-out templates and operand pairs, scored in one pass.

Background
    The key heads are found on arithmetic prompts (templates.json: 4 operations x 3 formations x 4 templates), so
    arithmetic is where fine-tuning them should show first. The word problems of Zhang et al. (2024, Table 1) are
    out of reach of a 135M model; its few-shot arithmetic is not (the default model answers 32% of subtraction
    prompts, 64% of addition ones). Prompts come from the leakage-free split (data/arithmetic_split.py): test
    templates x test pairs, or the multi-digit transfer set, with solved examples of the same template.

Scoring (no generation; one forward pass over prompt + answer, teacher forced)
    t = tokens(prompt + answer), s = index of the answer's first token (data/tokens.continuation_span), n = |t|

        first-token correct   argmax_v logits(t[:s])[v] == t[s]         (END, what identify and transfer score)
        exact match           argmax_v logits(t[:k])[v] == t[k] for every k = s .. n-1, and the argmax after
                              the whole answer, argmax_v logits(t)[v], is not a token starting with a digit
        log p(answer)         sum_{k=s}^{n-1} log softmax(logits(t[:k]))[t[k]]

    Teacher forcing makes the exact check one pass: position k sees the gold tokens before it, which are the
    greedy ones exactly when every check before k passed, so exact match is "greedy decoding writes this number
    and ends it there". For single-digit answers both differ only by that end check. Logits are the float32
    readout of `ModelView.vocab_logits` at the scored positions (evaluate/choice.py `log_prob_batches`).

Confidence intervals: the Wilson score interval at 95% (z = 1.96) of k correct of n,

        centre = (p + z^2 / 2n) / (1 + z^2 / n),   half = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)

    with p = k / n; it stays inside [0, 1] and is not degenerate at p = 0 or 1 (Wilson 1927).

Groups (`group_rows`): the whole benchmark, each operation, and each (operation, formation), every one with n,
correct, accuracy and its interval, exact matches and theirs. The evaluate stage writes them to arithmetic.csv.

Usage
    >>> scores = score_answers(handle.view, handle.tokenizer, ["3 + 4 = "], ["7"])
    >>> scores[0].first_correct, scores[0].exact
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from arithmech.data.arithmetic_split import (
    TRANSFER_PER_TEMPLATE,
    ArithmeticSplit,
    split_prompts,
    transfer_prompts,
)
from arithmech.data.prompts import PromptPair
from arithmech.data.sampling import stratified_sample
from arithmech.data.tokens import continuation_span, pad_id_of
from arithmech.errors import ConfigError
from arithmech.evaluate.choice import ScoredRow, log_prob_batches, truncate_row
from arithmech.evaluate.generation import context_length
from arithmech.models.view import ModelView
from arithmech.progress import Progress

ARITHMETIC_SETS: tuple[str, ...] = ("split", "multidigit")
"""What an arithmetic benchmark asks: the split's test (or validation) part, or the multi-digit transfer set."""
GROUP_COLUMNS: tuple[str, ...] = ("benchmark", "operation", "formation", "n", "correct", "accuracy", "ci_low",
                                  "ci_high", "exact", "exact_accuracy", "exact_ci_low", "exact_ci_high")  # fmt: skip
ALL = "all"
Z_95 = 1.959963984540054


@dataclass(frozen=True)
class AnswerScore:
    """One prompt: first answer token right, whole number right (and ended), log p(answer), what was predicted."""

    first_correct: bool
    exact: bool
    logprob: float
    predicted: str
    """The most likely first answer token, decoded."""
    n_tokens: int


@torch.no_grad()
def score_answers(
    view: ModelView,
    tokenizer: Any,
    prompts: Sequence[str],
    answers: Sequence[str],
    batch_size: int = 8,
    progress: Progress | None = None,
) -> list[AnswerScore]:
    """Score every answer after its prompt (see the module docstring); result[i] for prompts[i]."""
    limit = context_length(view.model)
    rows = []
    for prompt, answer in zip(prompts, answers, strict=True):
        whole, start = continuation_span(tokenizer, prompt, answer)
        targets = [(k - 1, whole[k]) for k in range(start, len(whole))]
        rows.append(truncate_row(ScoredRow(whole, [*targets, (len(whole) - 1, -1)]), limit))  # -1: the token after
    where = {id(row): i for i, row in enumerate(rows)}
    scores: list[AnswerScore | None] = [None] * len(rows)
    for batch, logprobs in log_prob_batches(view, rows, pad_id_of(tokenizer), batch_size, progress):
        best = logprobs.argmax(-1).tolist()  # [targets of the batch]
        offset = 0
        for row in batch:
            tokens = [t for _, t in row.targets[:-1]]
            guess = best[offset : offset + len(row.targets)]
            logprob = sum(float(logprobs[offset + k, t]) for k, t in enumerate(tokens))
            hits = [g == t for g, t in zip(guess[:-1], tokens, strict=True)]
            ended = not tokenizer.decode([guess[-1]])[:1].isdigit()
            scores[where[id(row)]] = AnswerScore(hits[0], all(hits) and ended, logprob,
                                                 tokenizer.decode([guess[0]]), len(tokens))  # fmt: skip
            offset += len(row.targets)
    assert all(s is not None for s in scores)
    return [s for s in scores if s is not None]


def wilson_interval(k: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (NaN, NaN for n = 0)."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def arithmetic_prompts(
    split: ArithmeticSplit, which: str, operations: tuple[str, ...], part: str, n_shot: int
) -> list[PromptPair]:
    """The prompts an arithmetic benchmark asks: the split's `part`, or the multi-digit transfer set."""
    if which == "multidigit":
        if part != "test":
            raise ConfigError("the multi-digit transfer set is held out for testing only; use arithmetic_part test")
        return transfer_prompts(split, operations, TRANSFER_PER_TEMPLATE, n_shot)
    if which != "split":
        raise ConfigError(f"arithmetic set {which!r} is not one of {', '.join(ARITHMETIC_SETS)}")
    return split_prompts(split, part, operations, few_shot=n_shot)


def arithmetic_records(
    view: ModelView,
    tokenizer: Any,
    prompts: list[PromptPair],
    limit: int | None,
    seed: int,
    batch_size: int,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """One record per scored prompt (a seeded subset stratified by operation and template when `limit` is set)."""
    if limit is not None:
        prompts = [prompts[i] for i in stratified_sample(prompts, limit, seed)]
    scores = score_answers(view, tokenizer, [p.reference for p in prompts], [p.answer for p in prompts],
                           batch_size, progress)  # fmt: skip
    return [
        {"id": f"{i:04d}-{p.template_id}-{p.a}-{p.b}", "template_id": p.template_id, "operation": p.operation,
         "formation": p.formation, "a": p.a, "b": p.b, "gold": p.answer, "predicted": s.predicted,
         "correct": s.first_correct, "exact": s.exact, "logprob": s.logprob, "n_answer_tokens": s.n_tokens,
         "part": p.extra.get("part"), "examples": p.extra.get("examples")}
        for i, (p, s) in enumerate(zip(prompts, scores, strict=True))
    ]  # fmt: skip


def group_rows(name: str, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Counts, accuracies and Wilson intervals: overall, per operation, per (operation, formation)."""
    keys = [(ALL, ALL)]
    for op in dict.fromkeys(str(r["operation"]) for r in records):
        keys.append((op, ALL))
        keys += [(op, f) for f in dict.fromkeys(str(r["formation"]) for r in records if r["operation"] == op)]
    rows = []
    for op, formation in keys:
        mine = [r for r in records if op in (ALL, r["operation"]) and formation in (ALL, r["formation"])]
        n, correct, exact = len(mine), sum(bool(r["correct"]) for r in mine), sum(bool(r["exact"]) for r in mine)
        (lo, hi), (elo, ehi) = wilson_interval(correct, n), wilson_interval(exact, n)
        rows.append({"benchmark": name, "operation": op, "formation": formation, "n": n, "correct": correct,
                     "accuracy": correct / n if n else math.nan, "ci_low": lo, "ci_high": hi, "exact": exact,
                     "exact_accuracy": exact / n if n else math.nan, "exact_ci_low": elo, "exact_ci_high": ehi})
    return rows
