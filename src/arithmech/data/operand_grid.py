"""Every operand pair of a grid as a prompt: the data of a heuristic-neuron scan (Nikankin et al. 2025).

Background
    Nikankin et al. read each MLP neuron's activation as a function of the two operands, over all pairs
    (A, B) whose result is one token. Here the operands run over 0..size-1 (size at most the tokenizer's
    single-token numbers, `data.number_tokens`); a pair is kept when `generate.solve` allows it (subtraction
    A >= B, division exact with B != 0) and its result is also a single-token number. Above `max_pairs`
    valid pairs, a seeded sample of them is taken (uniform, without replacement, in grid order).

Prompts
    One template per operation. Every prompt of the grid gets the SAME few-shot prefix of solved examples
    (drawn once per template from the valid pairs, seeded), so two prompts differ only in the final query's
    operands: a neuron's activation pattern over the grid then reflects the operands alone, and the prefix's
    keys and values can be computed once (`models/shared_prefix.py`). The counterfactual of each pair is its
    reference (the scan needs none).

Examples outside the queried cells
    No query may find its own problem solved in the prefix (the model would copy the answer, and its
    activations there would reflect the copy, not the arithmetic). So the examples' cells are not queried,
    and neither are their swaps (B, A), whose answer is the same for addition and multiplication and which
    the grid would otherwise hold next to them: the grid is the valid pairs less those (and, above
    `max_pairs`, a sample of the rest). `valid` still counts every valid pair.

Usage
    >>> grid = operand_grid(template, size=10, n_results=10, few_shot=3, max_pairs=512, seed=0)
    >>> grid.operands[:3], grid.results[:3]      # [(0, 0), (0, 1), (0, 2)], [0, 1, 2] for addition
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from arithmech.data.generate import build_pair, solve
from arithmech.data.prompts import PromptPair
from arithmech.data.templates import Template
from arithmech.errors import ConfigError


@dataclass(frozen=True)
class OperandGrid:
    """The valid operand pairs of one operation (possibly a sample), their results and prompts."""

    operation: str
    template_id: str
    size: int
    """Operands run over 0..size-1."""
    operands: list[tuple[int, int]]
    results: list[int]
    pairs: list[PromptPair]
    examples: list[tuple[int, int]]
    """The few-shot problems every prompt starts with (never queried, nor their swaps)."""
    valid: int
    """Valid pairs in the whole grid (before any sample)."""


def valid_operands(operation: str, size: int, n_results: int) -> list[tuple[int, int]]:
    """Pairs (A, B) of 0..size-1 in grid order whose result exists and is below n_results."""
    out = []
    for a in range(size):
        for b in range(size):
            c = solve(operation, a, b)
            if c is not None and 0 <= c < n_results:
                out.append((a, b))
    return out


def operand_grid(
    template: Template, size: int, n_results: int, few_shot: int, max_pairs: int, seed: int
) -> OperandGrid:
    """The grid of `template`'s operation; see the module docstring."""
    if size < 2:
        raise ConfigError(f"the operand grid needs at least 2 numbers per operand (got {size})")
    pool = valid_operands(template.operation, size, n_results)
    if not pool:
        raise ConfigError(
            f"operands 0..{size - 1} give no {template.operation} problem with a single-token result; use a larger grid"
        )
    rng = random.Random(f"{seed}:operand-grid:{template.id}")
    if len(pool) <= few_shot:
        raise ConfigError(
            f"operands 0..{size - 1} give only {len(pool)} {template.operation} problems with a single-token result, "
            f"too few for {few_shot} few-shot examples and a query outside them; use a larger grid or fewer examples"
        )
    examples = rng.sample(pool, few_shot)
    held = {*examples, *((b, a) for a, b in examples)}
    rest = [p for p in pool if p not in held]
    if not rest:
        raise ConfigError(
            f"every {template.operation} problem of operands 0..{size - 1} is a few-shot example or its swap; "
            "use a larger grid or fewer examples"
        )
    chosen = rest if len(rest) <= max_pairs else [rest[i] for i in sorted(rng.sample(range(len(rest)), max_pairs))]
    pairs = []
    for a, b in chosen:
        pair = build_pair(template, (a, b), examples)
        pairs.append(replace(pair, counterfactual=pair.reference))
    results = [solve(template.operation, a, b) for a, b in chosen]
    return OperandGrid(template.operation, template.id, size, chosen, [int(c) for c in results if c is not None],
                       pairs, list(examples), len(pool))  # fmt: skip
