"""Arithmetic as a benchmark: the project's own templates on held-out templates and operand pairs, scored in one pass.

Background
    The key heads are found on arithmetic prompts (templates.json: 4 operations x 3 formations x 4 templates), so
    arithmetic is where fine-tuning them should show first. The word problems of Zhang et al. (2024, Table 1) are
    out of reach of a 135M model; its few-shot arithmetic is not (the default model answers 32% of subtraction
    prompts, 64% of addition ones). Prompts come from the leakage-free split (data/arithmetic_split.py): test
    templates x test pairs, or the multi-digit transfer set, with solved examples of the same template.

Scoring (no generation; one forward pass over prompt + answer, teacher forced)
    t = tokens(prompt + answer), s = index of the answer's first token (data/tokens.continuation_span), n = |t|

        first-token correct   argmax_v logits(t[:s])[v] == t[s]         (END, what identify scores)
        exact match           argmax_v logits(t[:k])[v] == t[k] for every k = s .. n-1, and the argmax after
                              the whole answer, argmax_v logits(t)[v], is not a token starting with a digit
        tokens correct        #{k in s .. n-1 : argmax_v logits(t[:k])[v] == t[k]}  (per digit, teacher forced)
        log p(answer)         sum_{k=s}^{n-1} log softmax(logits(t[:k]))[t[k]]

    A benchmark's accuracy (`headline`) is exact match when an answer has several tokens (the multi-digit set on
    a digit-splitting tokenizer): the first token of "45" is a necessary, not a sufficient, condition of a right
    answer. With one-token answers it is first-token accuracy (the two differ only by the end check).

    Teacher forcing makes the exact check one pass: position k sees the gold tokens before it, which are the
    greedy ones exactly when every check before k passed, so exact match is "greedy decoding writes this number
    and ends it there". For single-digit answers both differ only by that end check. Logits are the float32
    readout of `ModelView.vocab_logits` at the scored positions (evaluate/choice.py `log_prob_batches`).

Confidence intervals: the Wilson score interval at 95% of k correct of n,

        centre = (p + z^2 / 2n) / (1 + z^2 / n),   half = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)

    with p = k / n (Wilson 1927), taken on the effective number of prompts n_eff: the prompts are templates
    crossed with problems, correlated within each, so n_eff comes from their two-way clustered variance
    (evaluate/clustered_interval.py; n_eff <= n, equal to about n when outcomes are independent). Since that
    variance is estimated from few templates, z is Student's t_{0.975} on min(templates, facts) - 1 degrees of
    freedom (2.78 for 5 templates; 1.96 only with many).

Groups (`group_rows`): the whole benchmark, each operation, and each (operation, formation), every one with n,
correct, accuracy, n_eff and its interval, exact matches and theirs, and the share of answer tokens right (per
digit). The evaluate stage writes them to arithmetic.csv.

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
from arithmech.data.facts import Fact, fact_of
from arithmech.data.prompts import PromptPair
from arithmech.data.sampling import stratified_sample
from arithmech.data.tokens import continuation_span, pad_id_of
from arithmech.errors import ConfigError
from arithmech.evaluate.choice import ScoredRow, log_prob_batches, truncate_row
from arithmech.evaluate.clustered_interval import clustered_wilson
from arithmech.models.context import context_length
from arithmech.models.view import ModelView
from arithmech.progress import Progress

ARITHMETIC_SETS: tuple[str, ...] = ("split", "multidigit")
"""What an arithmetic benchmark asks: the split's test (or validation) part, or the multi-digit transfer set."""
GROUP_COLUMNS: tuple[str, ...] = ("benchmark", "operation", "formation", "n", "correct", "accuracy", "n_effective",
                                  "ci_low", "ci_high", "exact", "exact_accuracy", "exact_n_effective", "exact_ci_low",
                                  "exact_ci_high", "answer_tokens", "token_accuracy")  # fmt: skip
ALL = "all"


@dataclass(frozen=True)
class AnswerScore:
    """One prompt: first answer token right, whole number right (and ended), log p(answer), what was predicted."""

    first_correct: bool
    exact: bool
    logprob: float
    predicted: str
    """The most likely first answer token, decoded."""
    n_tokens: int
    tokens_correct: int
    """Answer tokens that are the most likely token after the gold ones before them (teacher forced)."""


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
                                                 tokenizer.decode([guess[0]]), len(tokens), sum(hits))  # fmt: skip
            offset += len(row.targets)
    assert all(s is not None for s in scores)
    return [s for s in scores if s is not None]


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
    prompts = scored_subset(prompts, limit, seed)
    scores = score_answers(view, tokenizer, [p.reference for p in prompts], [p.answer for p in prompts],
                           batch_size, progress)  # fmt: skip
    return [
        {"id": f"{i:04d}-{p.template_id}-{p.a}-{p.b}", "template_id": p.template_id, "operation": p.operation,
         "formation": p.formation, "a": p.a, "b": p.b, "gold": p.answer, "predicted": s.predicted,
         "correct": s.first_correct, "exact": s.exact, "logprob": s.logprob, "n_answer_tokens": s.n_tokens,
         "tokens_correct": s.tokens_correct,
         "part": p.extra.get("part"), "examples": p.extra.get("examples")}
        for i, (p, s) in enumerate(zip(prompts, scores, strict=True))
    ]  # fmt: skip


def scored_subset(prompts: list[PromptPair], limit: int | None, seed: int) -> list[PromptPair]:
    """The prompts an arithmetic benchmark scores: all, or `limit` of them stratified by operation and template."""
    return prompts if limit is None else [prompts[i] for i in stratified_sample(prompts, limit, seed)]


def cluster_labels(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[Fact]]:
    """Each record's template and the fact its problem states: the two ways prompts are clustered."""
    return [str(r["template_id"]) for r in records], [fact_of(str(r["operation"]), int(r["a"]), int(r["b"]))
                                                      for r in records]  # fmt: skip


def group_rows(name: str, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Counts, accuracies and clustered Wilson intervals: overall, per operation, per (operation, formation)."""
    keys = [(ALL, ALL)]
    for op in dict.fromkeys(str(r["operation"]) for r in records):
        keys.append((op, ALL))
        keys += [(op, f) for f in dict.fromkeys(str(r["formation"]) for r in records if r["operation"] == op)]
    rows = []
    for op, formation in keys:
        mine = [r for r in records if op in (ALL, r["operation"]) and formation in (ALL, r["formation"])]
        templates, facts = cluster_labels(mine)
        hits, exacts = [bool(r["correct"]) for r in mine], [bool(r["exact"]) for r in mine]
        n, correct, exact = len(mine), sum(hits), sum(exacts)
        (lo, hi, n_eff), (elo, ehi, en_eff) = (clustered_wilson(hits, templates, facts),
                                               clustered_wilson(exacts, templates, facts))  # fmt: skip
        tokens = sum(int(r["n_answer_tokens"]) for r in mine)
        rows.append({"benchmark": name, "operation": op, "formation": formation, "n": n, "correct": correct,
                     "accuracy": correct / n if n else math.nan, "n_effective": n_eff, "ci_low": lo, "ci_high": hi,
                     "exact": exact, "exact_accuracy": exact / n if n else math.nan, "exact_n_effective": en_eff,
                     "exact_ci_low": elo, "exact_ci_high": ehi, "answer_tokens": tokens,
                     "token_accuracy": sum(int(r["tokens_correct"]) for r in mine) / tokens if tokens else math.nan})
    return rows


def headline(records: Sequence[dict[str, Any]]) -> tuple[str, int]:
    """What a benchmark's accuracy counts, and how many prompts are right by it: whole numbers (exact match)
    when an answer has several tokens, else the (only) first token (see the module docstring)."""
    if any(int(r["n_answer_tokens"]) > 1 for r in records):
        return "exact", sum(bool(r["exact"]) for r in records)
    return "first token", sum(bool(r["correct"]) for r in records)
