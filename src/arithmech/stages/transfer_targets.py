"""A transfer target made ready for knockout: its prompts built, filtered and sampled, and its ablation values.

Steps (`prepare_target`; the same prompts for every source of the transfer stage)
    1. Prompts: `build_target_pairs`, tokenized; prompts longer than the model's context are dropped. Held out
       from every source: where some of the target's prompts state a fact (a problem, its swap or its inverse,
       `data/facts.py`) that a source's components were ranked on, or are a ranked prompt (an "addition" target
       of an addition identify run: same templates and seed, so the very same prompts), the target is generated
       again with its queries among the other facts, and any prompt still shared is dropped (`data/heldout.py`).
       So no row of the matrix is scored in sample; `replaced` counts, per source, the prompts of the
       unrestricted target that would have been, and targets that share nothing are built exactly as before.
    2. Reference filtering, as identify does: base_accuracy = share of the target's prompts answered, i.e.
       whose whole answer is the top token at every answer position (arithmetic sets: every token of a
       multi-digit or decimal answer, one row per token with the answer's earlier tokens appended, teacher
       forced, as identify --answer-digits; word problems: the answer's first token at END); keep those (unless
       filter_correct is off) and draw max_prompts of them, a seeded sample stratified by operation and
       template (`data/sampling.py`), each with all its rows.
    3. Ablation values from the whole target set (every prompt that fits, answered or not; METHODS.md sec. 3):
       arithmetic sets   mean over the target's counterfactual prompts (operator swapped) of the same
                         template and token length, groups of at least min_group_size prompts, else the END
                         mean at END (`knockout/ablation.py`); END only with end_only; or zero, or resample;
       word problems     no operator counterfactual exists, so mean = the END value averaged over all the
                         target's reference prompts ("mean over the data set"), placed at END;
                         resample = another prompt's END value at END; zero = zeros (at END, or at every
                         position with end_only off). END-only ablations of prompts that share their
                         solved examples run those examples once (`knockout/end_only.py`): same
                         numbers, ~4x fewer tokens per configuration.

A target with no prompt kept is returned with a note and no batch, not an error; the transfer stage writes
NaN rows for it.
"""

from __future__ import annotations

import functools
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from arithmech.data import PromptPair, TokenizedPairs, tokenize_pairs
from arithmech.data.heldout import Exclusion, ranked_facts
from arithmech.data.sampling import sample_record, stratified_sample
from arithmech.data.target_sets import TargetSpec, build_target_pairs, target_set
from arithmech.errors import ConfigError, DataError
from arithmech.knockout.ablation import AblationSources, ablation_sources, alignment_groups
from arithmech.knockout.end_only import EndValues, end_states
from arithmech.models.context import context_length
from arithmech.models.load import ModelHandle
from arithmech.models.predictions import predict_at_end
from arithmech.models.shared_prefix import common_prefix_length
from arithmech.patching.path import PatchingBatch
from arithmech.stages.transfer_config import TransferConfig, rows_per_pass


@dataclass
class PreparedTarget:
    """A target's kept prompts and ablation values, or why there are none."""

    name: str
    spec: TargetSpec
    n_total: int
    n_answered: int
    base_accuracy: float
    batch: PatchingBatch | None = None
    note: str = ""
    groups: int = 0
    prefix_len: int = 0
    """Tokens shared by every prompt, run once (word problems with END-only ablation); 0 = plain passes."""
    sources: AblationSources | None = None
    end_values: EndValues | None = None
    ablation: str = ""
    ablation_info: dict[str, Any] | None = None
    """Group sizes and fallbacks of the ablation values (generated sets)."""
    prompts: dict[str, Any] | None = None
    """Which prompts were scored (`data.sampling.sample_record`)."""
    pair_index: torch.Tensor | None = None
    """[row] the prompt of each row of `batch`, 0..n-1 (several rows per prompt of a multi-token answer)."""
    replaced: tuple[int, ...] = ()
    """Per source (in the order given): prompts of the unrestricted target that share a fact or a prompt with its
    ranked prompts, and were replaced (step 1)."""
    held_out: dict[str, Any] | None = None
    """What step 1 excluded (for metadata.json); None when the target shares nothing with any source."""

    @property
    def n_prompts(self) -> int:
        """Prompts scored (rows of a multi-token answer count once)."""
        return 0 if self.pair_index is None else int(self.pair_index.max()) + 1 if len(self.pair_index) else 0


def _take(t: TokenizedPairs, indices: list[int]) -> tuple[PatchingBatch, list[PromptPair]]:
    idx = torch.tensor(indices, dtype=torch.long)
    width = int(t.end[idx].max()) + 1
    batch = PatchingBatch(t.ref_ids[idx, :width], t.ref_mask[idx, :width], t.cf_ids[idx, :width],
                          t.cf_mask[idx, :width], t.end[idx], t.answer_ids[idx])
    return batch, [t.pairs[i] for i in indices]


def held_out_pairs(
    spec: TargetSpec, cfg: TransferConfig, excluded: Sequence[Exclusion]
) -> tuple[list[PromptPair], tuple[int, ...], dict[str, Any] | None]:
    """Step 1's prompts, held out from every source's ranked prompts; per source how many prompts of the
    unrestricted target it shared, and the record of what was excluded (None when nothing was shared)."""
    pairs = build_target_pairs(spec, cfg.target_options())
    replaced = tuple(sum(not ex.admits(p) for p in pairs) for ex in excluded)
    if not any(replaced):
        return pairs, replaced, None
    union = functools.reduce(operator.or_, excluded)
    held = [p for p in build_target_pairs(spec, cfg.target_options(), keep=union.keep) if union.admits(p)]
    record = {"excluded_facts": len(union.facts), "excluded_prompts": len(union.texts), "replaced": max(replaced),
              "prompts": len(held), "facts": len(ranked_facts(held))}  # fmt: skip
    return held, replaced, record


def prepare_target(
    handle: ModelHandle, name: str, cfg: TransferConfig, excluded: Sequence[Exclusion] = ()
) -> PreparedTarget:
    """Build, tokenize and filter a target set, and compute its ablation values (steps 1-3 above); `excluded`: the
    ranked prompts of every source, held out from."""
    spec = target_set(name)
    pairs, replaced, held_out = held_out_pairs(spec, cfg, excluded)
    if pairs:
        target = _prepare(handle, name, spec, pairs, cfg)
    else:
        note = "every prompt of this target states a fact a source was ranked on, so none is held out"
        target = PreparedTarget(name, spec, 0, 0, math.nan, note=note)
    target.replaced, target.held_out = replaced, held_out
    return target


def target_width(tokenizer: Any, name: str, cfg: TransferConfig, excluded: Sequence[Exclusion] = ()) -> int:
    """The widest prompt of target `name` (step 1), in tokens, before the context drops any: what the memory budget
    plans the stage at (plan/prompt_widths.py); 0 where it has none."""
    spec = target_set(name)
    pairs, _, _ = held_out_pairs(spec, cfg, excluded)
    try:
        return int(_tokenized(tokenizer, spec, pairs).ref_ids.shape[1]) if pairs else 0
    except DataError:  # the stage notes it and scores no prompt of this target
        return 0


def _tokenized(tokenizer: Any, spec: TargetSpec, pairs: list[PromptPair]) -> TokenizedPairs:
    """Step 1's prompts tokenized: word problems' answers by their first token, arithmetic's token by token."""
    word = spec.kind == "word"  # word problems: no counterfactual, and their answer's first token at END
    t, _ = tokenize_pairs(tokenizer, pairs, first_token_answers=word, counterfactual_required=not word,
                          answer_digits=not word, one_digit_tokens=False)  # fmt: skip
    return t


def _prepare(
    handle: ModelHandle, name: str, spec: TargetSpec, pairs: list[PromptPair], cfg: TransferConfig
) -> PreparedTarget:
    """Steps 1-3 above once the prompts are chosen."""
    word = spec.kind == "word"  # word problems: no counterfactual, and their answer's first token at END
    try:
        t = _tokenized(handle.tokenizer, spec, pairs)
    except DataError as exc:
        return PreparedTarget(name, spec, len(pairs), 0, math.nan, note=str(exc))
    limit = context_length(handle.model)
    too_long = set() if limit is None else set(t.pair_index[t.end >= limit].tolist())  # prompts, with all rows
    notes = [f"{len(too_long)} prompts longer than the context dropped"] if too_long else []
    if len(too_long) == t.n_pairs:
        return PreparedTarget(name, spec, 0, 0, math.nan, note="; ".join(notes))
    t = t.take([i for i, pair in enumerate(t.pair_index.tolist()) if pair not in too_long])
    whole, _ = _take(t, list(range(len(t.pair_index))))
    prompts = t.unique_pairs()
    end_only = word and (cfg.ablation != "zero" or cfg.end_only)
    prefix = common_prefix_length(whole.ref_ids, whole.end) if end_only else 0
    values = None
    if end_only:  # word problems: END values of every prompt; shared solved examples run once
        size = rows_per_pass(whole.ref_ids.shape[1] - prefix, cfg.batch_size)
        predictions, values = end_states(handle.view, whole, prefix, size)
    else:
        predictions = predict_at_end(handle.view, whole.ref_ids, whole.ref_mask, whole.end, whole.answer_ids,
                                     rows_per_pass(whole.ref_ids.shape[1], cfg.batch_size))
    wrong = torch.zeros(len(prompts)).index_add_(0, t.pair_index, (~predictions.correct).float())
    correct = (wrong == 0).tolist()  # [prompt] every answer token right
    n_answered = sum(correct)
    base = n_answered / len(prompts)
    keep = [i for i in range(len(prompts)) if not cfg.filter_correct or correct[i]]
    if not keep:
        notes.append(f"the model answered none of the {len(prompts)} prompts")
        return PreparedTarget(name, spec, len(prompts), 0, base, note="; ".join(notes))
    chosen = [keep[j] for j in stratified_sample([prompts[i] for i in keep], cfg.max_prompts, cfg.seed)]
    rows = t.pair_rows(chosen)  # positions in `whole`
    batch, _ = _take(t, rows)
    first = torch.ones_like(t.pair_index, dtype=torch.bool)  # [batch] the answer's first token: the prompt itself
    first[1:] = t.pair_index[1:] != t.pair_index[:-1]
    keys = [p.template_id if f else f"{p.template_id or 'custom'}#{q}"  # teacher-forced rows apart, by place
            for p, f, q in zip(t.pairs, first.tolist(), t.answer_place.tolist(), strict=True)]  # fmt: skip
    groups = alignment_groups(keys, whole.end + 1)
    prepared = PreparedTarget(name, spec, len(prompts), n_answered, base, batch, note="; ".join(notes),
                              groups=len(set(groups)), prefix_len=prefix, prompts=sample_record(prompts, chosen),
                              pair_index=t.take(rows).pair_index)  # fmt: skip
    if values is not None:
        end_values, prepared.ablation = end_ablation(values, cfg.ablation, cfg.seed)
        prepared.end_values = end_values.take(rows)
    else:
        sources = ablation_sources(handle.view, whole, cfg.ablation, groups, cfg.end_only, cfg.seed,
                                   cfg.min_group_size, rows_per_pass(whole.ref_ids.shape[1], cfg.batch_size))
        prepared.sources = sources.take(rows)
        prepared.ablation = sources.info["over"]
        prepared.ablation_info = sources.info
    return prepared


def end_ablation(values: EndValues, mode: str, seed: int) -> tuple[EndValues, str]:
    """Word problems: what replaces a knocked-out component at END, from every prompt of the set's END values."""
    if mode == "mean":
        return values.mean(), "mean over the data set (all its prompts that fit), at END"
    if mode == "zero":
        return values.zeros(), "zero, at END"
    n = len(values.z[0])
    if n < 2:
        raise ConfigError("resample ablation needs at least 2 prompts to draw from; use --ablation mean or zero")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    other = [0] * n
    for j, row in enumerate(order):  # a derangement: every prompt takes another's END value
        other[row] = order[(j + 1) % n]
    return values.take(other), "another prompt's END value (resample), at END"
