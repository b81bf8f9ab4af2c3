"""The reference set: prompt pairs the model answers, tokenized and sampled, as every stage builds it.

Background
    Zhang et al. (2024, section 3) patch and knock out on the reference prompts X_r the model gets right: a
    component cannot be said to carry a computation the model does not do. identify, knockout (with named
    components), the neurons stage and its held-out pruning prompts all need that set, built the same way, so
    it is built here, below the stages and analyses that use it (data depends on models/ to run the model, and
    on nothing above).

Steps (`build_reference_set`; its settings, `ReferenceSetConfig`, are in `data/reference_config.py`)
    1. pairs: a user's prompt file (`read_prompt_file`), or `generate_pairs` over the templates (a templates
       file, or the shipped ones): `reference_config.reference_pairs`, which the CLI also runs before the model
       loads, so a malformed file fails at once;
    2. tokens: `tokenize_pairs`; a pair whose answer is not one whole token, or whose counterfactual changes
       nothing, is refused (`pair_checks`); one whose counterfactual has another token length is rejected,
       counted and named;
    3. filter (`answer_check`): keep the prompts whose every answer token is the top token on the prompt and
       the answer's earlier tokens (so greedy decoding writes the whole answer; one token without
       answer_digits) and whose number ends there (the next top token is no digit), unless filter_correct is
       off; with the accuracy of every template;
    4. sample: max_prompts of the kept prompts (pairs, with all their answer tokens), seeded and stratified
       by operation and template (`data/sampling.py`).

Held-out prompts (`heldout_reference_set`)
    The sample of step 4 is the first max_prompts of a stratified deal over every kept prompt; the held-out
    prompts are a stratified sample of the others, so a score ranked on the reference set can be checked on
    prompts it has not seen (the neurons stage's pruning).

Usage
    >>> ref = build_reference_set(handle, ReferenceSetConfig(operations=("addition",), max_prompts=64))
    >>> ref.counts["used"], ref.template_accuracy["add-eq-0"]["accuracy"]
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from arithmech.data.answer_balance import warn_dominant
from arithmech.data.carries import carry_group
from arithmech.data.prompts import PromptPair
from arithmech.data.reference_config import ReferenceSetConfig, reference_pairs
from arithmech.data.sampling import stratified_sample
from arithmech.data.tokens import TokenizedPairs, tokenize_pairs
from arithmech.errors import DataError
from arithmech.models.context import SHORTER, check_fits_context
from arithmech.models.load import ModelHandle
from arithmech.models.predictions import top_tokens_at
from arithmech.progress import Progress
from arithmech.runs import atomic_write_json, code_version

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReferenceSet:
    """The sampled reference prompts, the accuracy of every template, and the counts of each step."""

    tokenized: TokenizedPairs
    template_accuracy: dict[str, dict[str, float | None]]
    """Per template: pairs, rejected_length_mismatch, kept, correct, accuracy (None when none was kept)."""
    counts: dict[str, int]
    carry_accuracy: dict[str, dict[str, float | int]] = field(default_factory=dict)
    """Per carry group (`data/carries.py`) of the pairs, before sampling: pairs, correct, accuracy; empty when
    no pair has a group."""


def build_reference_set(
    handle: ModelHandle, cfg: ReferenceSetConfig, cache_dir: Path | None = None, progress: Progress | None = None
) -> ReferenceSet:
    """Steps 1-4 of the module docstring; `cache_dir` and `progress` as in `answer_check`."""
    tokenized, kept, accuracy, counts, carry = kept_prompts(handle, cfg, cache_dir, progress)
    pairs = tokenized.unique_pairs()
    chosen = [kept[i] for i in stratified_sample([pairs[i] for i in kept], cfg.max_prompts, cfg.seed)]
    reference = tokenized.take_pairs(chosen)
    warn_dominant(reference.unique_pairs(), "the reference set", "the model answers prompts with this answer more "
                  "often than others (see the accuracy per template); identify on other operands or operations")
    counts = {**counts, "used": len(chosen)}
    if cfg.answer_digits:
        counts["scored_tokens"] = len(reference.end)  # rows: one per answer token
    return ReferenceSet(reference, accuracy, counts, carry)


def heldout_reference_set(handle: ModelHandle, cfg: ReferenceSetConfig, n: int) -> TokenizedPairs | None:
    """Up to n kept prompts that `build_reference_set(handle, cfg)` did not take, or None if there are none."""
    tokenized, kept, _, _, _ = kept_prompts(handle, cfg)
    pairs = tokenized.unique_pairs()
    taken = {kept[i] for i in stratified_sample([pairs[i] for i in kept], cfg.max_prompts, cfg.seed)}
    rest = [i for i in kept if i not in taken]
    if not rest:
        return None
    return tokenized.take_pairs([rest[j] for j in stratified_sample([pairs[i] for i in rest], n, cfg.seed)])


def answer_check(
    handle: ModelHandle,
    tokenized: TokenizedPairs,
    batch_size: int,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> torch.Tensor:
    """[pair] bool: the model writes the pair's whole answer greedily and ends the number there.

    Every token of the answer must be the top token on the prompt and the answer's earlier tokens, and, for an
    answer that ends in a digit, the top token after the whole answer must not start with a digit (a model that
    would write "12" for 1 does not answer 1; the arithmetic evaluation scores the same way). One sequence per
    pair, the prompt and its whole answer, read at every answer position and one past (`top_tokens_at`).
    With `cache_dir` the top tokens are saved there, keyed by the model, the sequences and the engine's
    version, and a rerun into the same folder reads them instead of running the model.
    """
    sequences, reads, answers = answer_sequences(tokenized)
    saved = None
    if cache_dir is not None:
        identity = json.dumps(handle.source, sort_keys=True, default=str)
        key = json.dumps([identity, code_version(), sequences, reads])  # code_version: no reuse across code changes
        saved = cache_dir / f"answer-check-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if saved is not None and saved.exists():
        logger.info("reusing the answer check saved in %s", saved)
        tops = json.loads(saved.read_text())
    else:
        tops = top_tokens_at(handle.view, sequences, reads, tokenized.pad_id, batch_size, progress)
        if saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(saved, tops)
    digit = _starts_with_digit(handle.tokenizer)
    numbers = [str(p.answer).rstrip()[-1:].isdigit() for p in tokenized.unique_pairs()]  # answer ends in a digit
    return torch.tensor([
        top[:-1] == answer and not (number and digit(top[-1]))
        for top, answer, number in zip(tops, answers, numbers, strict=True)
    ], dtype=torch.bool)  # fmt: skip


def answer_sequences(tokenized: TokenizedPairs) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Per pair: the prompt followed by its whole answer, the positions whose next token is an answer token (each
    row's END) and the one after the answer, and the answer's tokens."""
    rows_of: dict[int, list[int]] = {}
    for row, pair in enumerate(tokenized.pair_index.tolist()):
        rows_of.setdefault(pair, []).append(row)
    sequences, reads, answers = [], [], []
    for rows in rows_of.values():  # pairs in order; a pair's rows are its answer's tokens in order
        last = rows[-1]
        end = int(tokenized.end[last])
        sequences.append([*tokenized.ref_ids[last, : end + 1].tolist(), int(tokenized.answer_ids[last])])
        reads.append([*(int(tokenized.end[r]) for r in rows), end + 1])
        answers.append([int(tokenized.answer_ids[r]) for r in rows])
    return sequences, reads, answers


def _starts_with_digit(tokenizer: Any) -> Callable[[int], bool]:
    """Whether a token's text starts with a digit (it would continue a number written before it)."""
    return lambda token: tokenizer.decode([token])[:1].isdigit()


def kept_prompts(
    handle: ModelHandle,
    cfg: ReferenceSetConfig,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
    pairs: list[PromptPair] | None = None,
) -> tuple[
    TokenizedPairs, list[int], dict[str, dict[str, float | None]], dict[str, int], dict[str, dict[str, float | int]]
]:
    """Steps 1-3: every tokenized pair, the pair numbers kept, the accuracy per template, the counts, and the
    accuracy per carry group. `pairs`: these prompts instead of step 1's (`data/heldout.py`); DataError when the
    model answers none of them (with filter_correct)."""
    pairs = reference_pairs(cfg) if pairs is None else pairs
    tokenized, report = tokenize_pairs(handle.tokenizer, pairs, answer_digits=cfg.answer_digits)
    fix = "shorter prompts in the --prompts file, or a model with a longer context" if cfg.prompts_file else SHORTER
    check_fits_context(handle.model, tokenized.ref_ids.shape[1], fix)
    correct = answer_check(handle, tokenized, cfg.batch_size, cache_dir, progress)  # [pair]
    accuracy = _template_accuracy(tokenized.unique_pairs(), correct, report.per_template)
    keep = correct if cfg.filter_correct else torch.ones_like(correct)
    if not bool(keep.any()):
        _forget_answer_checks(cache_dir)  # a refused run leaves nothing behind
        advice = ("check the file's answers, or patch the prompts anyway with --keep-incorrect" if cfg.prompts_file
                  else "add solved examples before each query (--few-shot 3), use easier operands, or patch the "
                  "prompts anyway with --keep-incorrect")  # fmt: skip
        raise DataError(
            f"the model answered none of the {tokenized.n_pairs} prompts correctly, so there is no reference set; "
            + advice
        )
    counts = {
        "pairs": len(pairs),
        "rejected_length_mismatch": report.rejected_length_mismatch,
        "answered_correctly": int(correct.sum()),
    }
    return tokenized, keep.nonzero().flatten().tolist(), accuracy, counts, _carry_accuracy(tokenized, correct)


def _forget_answer_checks(cache_dir: Path | None) -> None:
    """Remove the saved answer checks in `cache_dir`, and the folder if that empties it."""
    if cache_dir is None or not cache_dir.is_dir():
        return
    for saved in cache_dir.glob("answer-check-*.json"):
        saved.unlink(missing_ok=True)
    if not any(cache_dir.iterdir()):
        cache_dir.rmdir()


def _carry_accuracy(tokenized: TokenizedPairs, correct: torch.Tensor) -> dict[str, dict[str, float | int]]:
    """Pairs, correct and accuracy per carry group of the pairs (`carry_group`); groupless pairs left out."""
    answered: dict[str, list[bool]] = {}
    for pair, ok in zip(tokenized.unique_pairs(), correct.tolist(), strict=True):
        if (group := carry_group(pair)) is not None:
            answered.setdefault(group, []).append(bool(ok))
    return {g: {"pairs": len(v), "correct": sum(v), "accuracy": sum(v) / len(v)} for g, v in sorted(answered.items())}


def _template_accuracy(
    pairs: list[PromptPair], correct: torch.Tensor, tokenized: dict[str, dict[str, int]]
) -> dict[str, dict[str, float | None]]:
    """Per template: pairs generated, rejected for a counterfactual of another length, kept, answered."""
    answered: dict[str, list[bool]] = {}
    for pair, ok in zip(pairs, correct.tolist(), strict=True):
        answered.setdefault(pair.template_id or "custom", []).append(bool(ok))
    table = {}
    for template, count in sorted(tokenized.items()):
        right = sum(answered.get(template, []))
        table[template] = {
            "pairs": count["kept"] + count["rejected"],
            "rejected_length_mismatch": count["rejected"],
            "kept": count["kept"],
            "correct": right,
            "accuracy": right / count["kept"] if count["kept"] else None,  # 0 of 0 answered: undefined
        }
    return table
