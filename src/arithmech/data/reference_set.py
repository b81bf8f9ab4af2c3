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
    3. filter: keep the prompts whose top token at END is the answer's first token (unless filter_correct is
       off), with the accuracy of every template;
    4. sample: max_prompts of the kept prompts, seeded and stratified by operation and template
       (`data/sampling.py`).

Held-out prompts (`heldout_reference_set`)
    The sample of step 4 is the first max_prompts of a stratified deal over every kept prompt; the held-out
    prompts are a stratified sample of the others, so a score ranked on the reference set can be checked on
    prompts it has not seen (the neurons stage's pruning).

Usage
    >>> ref = build_reference_set(handle, ReferenceSetConfig(operations=("addition",), max_prompts=64))
    >>> ref.counts["used"], ref.template_accuracy["add-eq-0"]["accuracy"]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arithmech.data.prompts import PromptPair
from arithmech.data.reference_config import ReferenceSetConfig, reference_pairs
from arithmech.data.sampling import stratified_sample
from arithmech.data.tokens import TokenizedPairs, tokenize_pairs
from arithmech.errors import DataError
from arithmech.models.load import ModelHandle
from arithmech.models.predictions import predict_at_end


@dataclass(frozen=True)
class ReferenceSet:
    """The sampled reference prompts, the accuracy of every template, and the counts of each step."""

    tokenized: TokenizedPairs
    template_accuracy: dict[str, dict[str, float | None]]
    """Per template: pairs, rejected_length_mismatch, kept, correct, accuracy (None when none was kept)."""
    counts: dict[str, int]


def build_reference_set(handle: ModelHandle, cfg: ReferenceSetConfig) -> ReferenceSet:
    """Steps 1-4 of the module docstring."""
    tokenized, kept, accuracy, counts = _kept_prompts(handle, cfg)
    chosen = [kept[i] for i in stratified_sample([tokenized.pairs[i] for i in kept], cfg.max_prompts, cfg.seed)]
    return ReferenceSet(tokenized.take(chosen), accuracy, {**counts, "used": len(chosen)})


def heldout_reference_set(handle: ModelHandle, cfg: ReferenceSetConfig, n: int) -> TokenizedPairs | None:
    """Up to n kept prompts that `build_reference_set(handle, cfg)` did not take, or None if there are none."""
    tokenized, kept, _, _ = _kept_prompts(handle, cfg)
    taken = {kept[i] for i in stratified_sample([tokenized.pairs[i] for i in kept], cfg.max_prompts, cfg.seed)}
    rest = [i for i in kept if i not in taken]
    if not rest:
        return None
    return tokenized.take([rest[j] for j in stratified_sample([tokenized.pairs[i] for i in rest], n, cfg.seed)])


def _kept_prompts(
    handle: ModelHandle, cfg: ReferenceSetConfig
) -> tuple[TokenizedPairs, list[int], dict[str, dict[str, float | None]], dict[str, int]]:
    """Steps 1-3: every tokenized pair, the indices kept, the accuracy per template, and the counts."""
    pairs = reference_pairs(cfg)
    tokenized, report = tokenize_pairs(handle.tokenizer, pairs)
    predictions = predict_at_end(
        handle.view, tokenized.ref_ids, tokenized.ref_mask, tokenized.end, tokenized.answer_ids, cfg.batch_size
    )
    accuracy = _template_accuracy(tokenized.pairs, predictions.correct, report.per_template)
    keep = predictions.correct if cfg.filter_correct else torch.ones_like(predictions.correct)
    if not bool(keep.any()):
        raise DataError(
            f"the model answered none of the {len(tokenized.pairs)} prompts correctly, "
            "so there is no reference set; "
            "add solved examples before each query (--few-shot 3) or use easier operands"
        )
    counts = {
        "pairs": len(pairs),
        "rejected_length_mismatch": report.rejected_length_mismatch,
        "answered_correctly": int(predictions.correct.sum()),
    }
    return tokenized, keep.nonzero().flatten().tolist(), accuracy, counts


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
