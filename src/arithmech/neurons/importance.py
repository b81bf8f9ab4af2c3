"""Head importance by zero ablation, per arithmetic operation, and which heads specialise in which operation.

Background
    Yu & Ananiadou (2024) find the heads that matter for arithmetic by zeroing one head at a time (its block
    of W_O contributes nothing) and measuring how far the probability of the model's original prediction at
    END falls. Done separately on addition, subtraction, multiplication and division prompts, this shows
    heads shared by all four operations and heads that matter for one operation only. (METHODS.md sec. 6.)

Formula, per operation o (prompts the model answers correctly, so the original top token is the answer)
    prob_drop[o, c]      = mean over prompts of  P_intact(w) - P_zeroed(c)(w)       w = the intact top token
    accuracy_drop[o, c]  = acc_intact - acc_zeroed(c)                               acc = top token is still w
    Shapes: [operation, component]; components are every head (and, optionally, every MLP) in
    `all_components` order. On a reference set built by `operation_sets` (correct prompts only) the intact
    top token is the answer, so accuracy_drop is the drop in accuracy; `base_accuracy` records the intact
    accuracy against the true answers either way.

How it is computed
    Rows of each forward pass are (configuration, prompt) pairs (`knockout/batched.knockout_scores` with the
    zero mode of `knockout/ablation.py`); configuration 0 zeroes nothing and gives the intact numbers.

Specialisation
    `specialised_heads(result, top=k)`: the top-k heads of each operation by prob_drop, the fraction of the
    operation's total positive drop (sum over heads of max(drop, 0)) they carry, the heads in the top-k of
    that operation only, and the heads in the top-k of every operation.

Usage
    >>> sets, counts = operation_sets(handle, ReferenceSetConfig(max_prompts=64))
    >>> result = head_importance(handle.view, sets)
    >>> spec = specialised_heads(result, top=10)
    >>> spec.only["multiplication"]                      # heads that matter for multiplication alone

References: Yu & Ananiadou, EMNLP 2024 (arXiv 2409.14144), sec. 3 (head importance, operation-specific
heads); METHODS.md sec. 6.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from arithmech.data import OPERATIONS
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import build_reference_set, heldout_reference_set
from arithmech.errors import ConfigError, DataError
from arithmech.knockout.ablation import ablation_sources
from arithmech.knockout.batched import knockout_scores
from arithmech.models.load import ModelHandle
from arithmech.models.predictions import predict_at_end
from arithmech.models.sites import Component, all_components
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadImportance:
    """Zero-ablation importance of every component on every operation's prompts."""

    operations: tuple[str, ...]
    components: list[Component]
    prob_drop: torch.Tensor  # [operation, component] mean drop in P(original top token)
    accuracy_drop: torch.Tensor  # [operation, component] drop in the fraction still predicting it
    base_prob: torch.Tensor  # [operation] mean intact P(original top token)
    base_accuracy: torch.Tensor  # [operation] intact accuracy against the true answers
    n_prompts: dict[str, int]

    def heads(self) -> list[int]:
        """Column indices of the heads (not MLPs) in `components`."""
        return [i for i, c in enumerate(self.components) if c.head is not None]


def operation_sets(
    handle: ModelHandle, cfg: ReferenceSetConfig | None = None, operations: Sequence[str] = OPERATIONS
) -> tuple[dict[str, PatchingBatch], dict[str, dict[str, int]]]:
    """One reference set per operation, generated and filtered as the identify stage does.

    `cfg` sets formations, few-shot examples, operand range, sample size and seed (its `operations` is
    replaced per operation). An operation the model answers no prompt of is left out, with a warning.
    """
    cfg = ReferenceSetConfig() if cfg is None else cfg
    if not operations or any(op not in OPERATIONS for op in operations):
        raise ConfigError(f"operations must be drawn from {', '.join(OPERATIONS)}; got {list(operations)}")
    sets: dict[str, PatchingBatch] = {}
    counts: dict[str, dict[str, int]] = {}
    for op in operations:
        try:
            reference = build_reference_set(handle, replace(cfg, operations=(op,)))
        except DataError as err:
            logger.warning("no %s prompts kept: %s", op, err)
            counts[op] = {"used": 0}
            continue
        t, counts[op] = reference.tokenized, reference.counts
        sets[op] = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    if not sets:
        raise DataError(
            "the model answered no prompt of any operation; add solved examples (few_shot) or easier operands"
        )
    return sets, counts


def heldout_set(handle: ModelHandle, cfg: ReferenceSetConfig, operation: str, n: int) -> PatchingBatch | None:
    """Up to n answered prompts of `operation` that its `operation_sets` set (same cfg) did not take, or None."""
    held = heldout_reference_set(handle, replace(cfg, operations=(operation,)), n)
    return None if held is None else PatchingBatch(held.ref_ids, held.ref_mask, held.cf_ids, held.cf_mask, held.end,
                                                   held.answer_ids)  # fmt: skip


@torch.no_grad()
def head_importance(
    view: ModelView,
    sets: Mapping[str, PatchingBatch],
    components: Sequence[Component] | None = None,
    include_mlps: bool = False,
    batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> HeadImportance:
    """Zero each component in turn on each operation's prompts; drops in P(top token) and accuracy.

    components defaults to every head (and every MLP with `include_mlps`) in `all_components` order.
    """
    if not sets:
        raise ConfigError("there are no prompt sets; give at least one operation's prompts")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1; got {batch_size}")
    if components is None:
        components = [c for c in all_components(view.dims) if include_mlps or c.head is not None]
    components = list(components)
    _check_components(view, components)
    configs: list[list[Component]] = [[], *([c] for c in components)]  # config 0 = intact
    prob_drop = torch.empty(len(sets), len(components))
    accuracy_drop = torch.empty(len(sets), len(components))
    base_prob = torch.empty(len(sets))
    base_accuracy = torch.empty(len(sets))
    n_prompts: dict[str, int] = {}
    for i, (op, batch) in enumerate(sets.items()):
        if len(batch) == 0:
            raise ConfigError(f"the {op} prompt set is empty; give at least one prompt per operation")
        top = predict_at_end(view, batch.ref_ids, batch.ref_mask, batch.end, batch.answer_ids, batch_size).top_token
        base_accuracy[i] = (top == batch.answer_ids.cpu()).float().mean()
        as_top = replace(batch, answer_ids=top)  # score the original prediction
        sources = ablation_sources(view, as_top, "zero", groups=[0] * len(as_top))
        scores = knockout_scores(view, as_top, sources, configs, batch_size, progress)
        drops = scores.answer_prob[0:1] - scores.answer_prob[1:]  # [component, prompt]
        prob_drop[i] = drops.mean(1)
        base_prob[i] = scores.answer_prob[0].mean()
        accuracy_drop[i] = scores.accuracy[0] - scores.accuracy[1:]
        n_prompts[op] = len(batch)
    return HeadImportance(tuple(sets), components, prob_drop, accuracy_drop, base_prob, base_accuracy, n_prompts)


@dataclass(frozen=True)
class Specialisation:
    """Which heads carry which operation, from the top-k heads by prob_drop of each operation."""

    top: dict[str, list[Component]]
    """The top-k heads of each operation, largest drop first."""
    share: dict[str, float]
    """Fraction of the operation's total positive drop that its top-k heads carry."""
    only: dict[str, list[Component]]
    """Heads in the top-k of this operation and of no other."""
    shared: list[Component]
    """Heads in the top-k of every operation."""


def specialised_heads(result: HeadImportance, top: int = 10) -> Specialisation:
    """Top heads per operation, the share of the drop they carry, and the heads specific to one operation."""
    columns = result.heads()
    if not 0 < top <= len(columns):
        raise ConfigError(f"top must be in 1..{len(columns)} (the number of heads); got {top}")
    heads = [result.components[j] for j in columns]
    drops = result.prob_drop[:, columns]  # [operation, head]
    tops: dict[str, list[Component]] = {}
    share: dict[str, float] = {}
    for i, op in enumerate(result.operations):
        order = drops[i].topk(top).indices.tolist()
        tops[op] = [heads[j] for j in order]
        positive = drops[i].clamp(min=0)
        total = float(positive.sum())
        share[op] = float(positive[order].sum()) / total if total > 0 else float("nan")
    sets = {op: set(h) for op, h in tops.items()}
    only = {op: [h for h in tops[op] if not any(h in s for o, s in sets.items() if o != op)] for op in tops}
    shared = [h for h in tops[result.operations[0]] if all(h in s for s in sets.values())]
    return Specialisation(tops, share, only, shared)


def _check_components(view: ModelView, components: list[Component]) -> None:
    d = view.dims
    for c in components:
        if not 0 <= c.layer < d.n_layers or (c.head is not None and not 0 <= c.head < d.n_heads):
            raise ConfigError(
                f"component {c} does not exist: the model has layers 0..{d.n_layers - 1} and heads 0..{d.n_heads - 1}"
            )
    if not components:
        raise ConfigError("no components to zero; give at least one head")
