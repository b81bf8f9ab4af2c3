"""Held-out prompts: the templates components were ranked on, with query facts the ranking never saw.

Background
    A knockout curve scored on the prompts its components were ranked on is an in-sample number: path patching
    picked the components that matter on exactly those prompts, so knocking them out there is expected to hurt
    (selection bias). Find on one part of the data, evaluate on another: held-out prompts share no prompt and no
    arithmetic fact with the ranked ones, and are otherwise built as the ranked ones were.

Rule (`heldout_prompts`)
    ranked  the prompts the ranking was made on: an identify run's reference set (its prompts.jsonl).
    fact    what a prompt's final query states (`data/facts.py`): 3 + 5 and 5 + 3 state one fact, so do 7 - 2 and
            7 - 5, and so do 2 + 3 and 5 - 3 (a fact links addition with subtraction, multiplication with
            division). A prompt of another template, or with other solved examples, whose query states a ranked
            fact is not held out: the ranking saw the model compute that fact.
    1. Candidates. A generated run: its own generation settings (templates, operations, formations, operands,
       few-shot, prompts per template, seed), every query drawn among the problems whose fact no ranked prompt
       states (`generate_pairs(keep=...)`). The run's leftovers (prompts generated but not sampled) are not
       used as such: at the default settings (12 addition templates x 16 prompts over 30 facts) a reference set
       of 64 prompts states 26 of the 30 facts, 108 of the 128 prompts it leaves state one of them, and identify
       has already taken up to 64 of those the model answers. A run made from a prompts file: that file's
       prompts (nothing can be generated for them). Either way a candidate whose text is a ranked prompt's, or
       whose fact is a ranked prompt's, is dropped; a prompt that states no known fact (a user's prompt without
       operands) is held out by its text alone, and the record counts such prompts. The solved examples of the
       few-shot prefix are drawn from every valid problem, ranked facts included: they are context the model
       reads, not the answer it computes, and the ranked prompts hold such examples too.
    2. Filter: tokenized and answer-checked as identify does (`data/reference_set.py` steps 2-3: kept only if
       answered correctly, unless the run kept incorrect ones).
    3. Sample: `n` of them (the knockout stage asks for as many as the ranked set holds, so both sets' ablation
       means are over as many prompts), seeded and stratified by operation and template (`data/sampling.py`).
    With no candidate left (every fact ranked, none answered, a templates file gone) there is no held-out set:
    `HeldOut.tokenized` is None and the record says why; that is not an error.

Usage
    >>> held = heldout_prompts(handle, run.pairs, reference_config(run.metadata["config"]), n=len(run.pairs))
    >>> held.record["shared_with_ranked"]
    {'prompts': 0, 'facts': 0}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from arithmech.data.facts import Fact, fact_of, pair_fact
from arithmech.data.generate import generate_pairs
from arithmech.data.io import read_prompt_file
from arithmech.data.prompts import PromptPair
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import kept_prompts
from arithmech.data.sampling import stratified_sample
from arithmech.data.templates import load_templates
from arithmech.data.tokens import TokenizedPairs
from arithmech.errors import ConfigError, DataError
from arithmech.models.load import ModelHandle
from arithmech.progress import Progress

RULE = (
    "prompts of the ranked prompts' templates whose final query states no fact of a ranked prompt (a problem, its "
    "swap or its inverse: data/facts.py), generated with the identify run's settings (a prompts file's own prompts "
    "for a run made from one), filtered to correct answers as identify does, then a seeded sample stratified by "
    "operation and template"
)


@dataclass(frozen=True)
class HeldOut:
    """The held-out prompts (None when there are none) and what metadata.json records of them."""

    tokenized: TokenizedPairs | None
    record: dict[str, Any]


def reference_config(config: dict[str, Any]) -> ReferenceSetConfig:
    """The reference-set settings of an identify run's recorded "config" (settings it lacks take their default)."""
    names = {f.name for f in dataclasses.fields(ReferenceSetConfig)}
    return ReferenceSetConfig(**{k: v for k, v in config.items() if k in names})


def ranked_facts(pairs: Sequence[PromptPair]) -> set[Fact]:
    """The facts the final queries of `pairs` state (prompts that state none left out)."""
    return {fact for pair in pairs if (fact := pair_fact(pair)) is not None}


@dataclass(frozen=True)
class Exclusion:
    """What a held-out prompt may not share with ranked prompts: their texts and the facts their queries state."""

    facts: frozenset[Fact] = frozenset()
    texts: frozenset[str] = frozenset()

    @classmethod
    def of(cls, ranked: Sequence[PromptPair]) -> Exclusion:
        return cls(frozenset(ranked_facts(ranked)), frozenset(p.reference for p in ranked))

    def __or__(self, other: Exclusion) -> Exclusion:
        return Exclusion(self.facts | other.facts, self.texts | other.texts)

    def admits(self, pair: PromptPair) -> bool:
        """Whether `pair` shares neither its text nor its query's fact with a ranked prompt."""
        return pair.reference not in self.texts and pair_fact(pair) not in self.facts

    def keep(self, operation: str, problem: tuple[int, int]) -> bool:
        """`generate_pairs`'s keep: the problem (a valid one) states no ranked fact."""
        return fact_of(operation, *problem) not in self.facts


def heldout_prompts(
    handle: ModelHandle,
    ranked: Sequence[PromptPair],
    cfg: ReferenceSetConfig,
    n: int,
    answer_digits: bool | None = None,
    progress: Progress | None = None,
) -> HeldOut:
    """Up to n prompts that share no prompt and no fact with `ranked`, built as `cfg` built them (module docstring).

    answer_digits: score answers token by token (default cfg's); the prompts are generated as cfg says either way.
    """
    fresh, record = fresh_candidates(cfg, ranked)
    if not fresh:
        return HeldOut(None, record)
    digits = cfg.answer_digits if answer_digits is None else answer_digits
    try:
        tokenized, kept, _, counts, _ = kept_prompts(
            handle, dataclasses.replace(cfg, answer_digits=digits), progress=progress, pairs=fresh
        )
    except DataError as exc:  # none answered correctly, or none left once tokenized
        return HeldOut(None, {**record, "why_none": str(exc)})
    pairs = tokenized.unique_pairs()
    answered = [pairs[i] for i in kept]
    picks = stratified_sample(answered, n, cfg.seed)
    held = tokenized.take_pairs([kept[j] for j in picks])
    used = held.unique_pairs()
    record.update(
        answered=counts["answered_correctly"], kept=len(kept), used=len(used),
        facts=len(ranked_facts(used)), without_fact=sum(pair_fact(p) is None for p in used),
        shared_with_ranked={"prompts": len({p.reference for p in used} & {p.reference for p in ranked}),
                            "facts": len(ranked_facts(used) & ranked_facts(ranked))},
    )  # fmt: skip
    return HeldOut(held, record)


def fresh_candidates(
    cfg: ReferenceSetConfig, ranked: Sequence[PromptPair]
) -> tuple[list[PromptPair], dict[str, Any]]:
    """Step 1: the candidates that share no prompt and no fact with `ranked` (none needs the model), and the record
    so far; with none, the record's "why_none" says why."""
    excluded = Exclusion.of(ranked)
    record: dict[str, Any] = {
        "rule": RULE,
        "ranked": {"prompts": len(ranked), "facts": len(excluded.facts),
                   "without_fact": sum(pair_fact(p) is None for p in ranked)},
    }  # fmt: skip
    try:
        candidates, record["source"] = _candidates(cfg, excluded)
    except (ConfigError, DataError, OSError) as exc:  # e.g. the run's templates file is gone
        return [], {**record, "why_none": f"its prompts cannot be made again: {exc}"}
    fresh = [p for p in candidates if excluded.admits(p)]
    record["candidates"] = {"made": len(candidates), "fresh": len(fresh)}
    if not fresh:
        record["why_none"] = (f"every candidate prompt states one of the {len(excluded.facts)} ranked facts; widen the "
                              "operand range (--operand-max) or rank on fewer prompts")  # fmt: skip
    return fresh, record


def _candidates(cfg: ReferenceSetConfig, excluded: Exclusion) -> tuple[list[PromptPair], str]:
    """Step 1's prompts before the ranked ones are dropped, and where they came from."""
    if cfg.prompts_file:
        return read_prompt_file(cfg.prompts_file), f"the prompts file {cfg.prompts_file}"
    templates = load_templates(cfg.templates_file) if cfg.templates_file else None
    pairs = generate_pairs(cfg.generation(), templates, keep=excluded.keep)
    return pairs, "generated with the identify run's settings, queries among the facts no ranked prompt states"
