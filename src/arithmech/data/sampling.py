"""Seeded samples of a prompt set, stratified by operation and template.

Why
    Prompt sets are written in template order (all Equation prompts, then Statement, ...). Taking the first n
    prompts of such a list analyses one formation only; a plain random sample leaves the mix to chance, and
    templates the model answers less often get fewer prompts. A stratified sample spreads the n prompts as
    evenly as the set allows over operations and, within each operation, over its templates.

Rule (`stratified_sample`)
    Prompts are grouped by operation, then by template. With a local RNG seeded by `seed`, each template's
    prompts are shuffled and the templates of each operation are dealt round-robin (in a shuffled order) into
    one queue per operation; the operations' queues are then dealt round-robin into one order, and its first n
    are the sample. So every operation gets n / #operations prompts (or all it has, the rest going to the
    others), and every template of an operation its share of those, to within one. The same prompts and seed
    give the same sample. Indices are returned in the set's own order.

Usage
    >>> chosen = stratified_sample(pairs, 32, seed=0)
    >>> sample_record(pairs, chosen)["per_template"]
    {'add-eq-0': 3, 'add-eq-1': 3, ...}
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from itertools import chain, zip_longest
from typing import Any

from arithmech.data.prompts import PromptPair

RULE = "seeded sample stratified by operation, then template (round-robin over shuffled strata)"


def stratified_sample(pairs: Sequence[PromptPair], n: int, seed: int) -> list[int]:
    """Indices of n prompts of `pairs` (all of them if n >= len(pairs)), spread over operations and templates."""
    if n >= len(pairs):
        return list(range(len(pairs)))
    rng = random.Random(f"{seed}:stratified-sample")
    strata: dict[str, dict[str, list[int]]] = {}
    for i, pair in enumerate(pairs):
        strata.setdefault(pair.operation or "", {}).setdefault(pair.template_id or "", []).append(i)
    queues = []
    for operation in sorted(strata):
        templates = [strata[operation][t] for t in sorted(strata[operation])]
        for members in templates:
            rng.shuffle(members)
        rng.shuffle(templates)
        queues.append(_deal(templates))
    rng.shuffle(queues)
    return sorted(_deal(queues)[:n])


def _deal(queues: list[list[int]]) -> list[int]:
    """Round-robin over the queues: the first of each, then the second of each, ..."""
    return [i for i in chain.from_iterable(zip_longest(*queues)) if i is not None]


def sample_record(pairs: Sequence[PromptPair], chosen: Sequence[int]) -> dict[str, Any]:
    """What metadata.json records about a sample: the rule, the indices, and the counts per stratum."""
    picked = [pairs[i] for i in chosen]
    return {
        "rule": RULE,
        "of": len(pairs),
        "n": len(picked),
        "indices": list(chosen),
        "per_operation": dict(sorted(Counter(p.operation or "custom" for p in picked).items())),
        "per_template": dict(sorted(Counter(p.template_id or "custom" for p in picked).items())),
    }


def sample_pairs(pairs: Sequence[PromptPair], n: int, seed: int) -> tuple[list[PromptPair], dict[str, Any]]:
    """The stratified sample itself, and its `sample_record` for metadata.json."""
    chosen = stratified_sample(pairs, n, seed)
    return [pairs[i] for i in chosen], sample_record(pairs, chosen)
