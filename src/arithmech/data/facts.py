"""Arithmetic facts: which problems state the same fact, so a split can keep them in one part.

Background
    A model that has trained on 3 + 5 = 8 has not met "a new problem" in 5 + 3; nor, after 7 - 2 = 5, in 7 - 5.
    A problem and its swap (addition, multiplication) or its inverse (subtraction a - b = c with a - c = b, division
    a / b = c with a / c = b) state one fact, written as a whole and its two parts in sorted order:

        addition        a + b = c   ->  ("sum", c, min(a, b), max(a, b))
        subtraction     a - b = c   ->  ("sum", a, min(b, c), max(b, c))
        multiplication  a * b = c   ->  ("product", c, min(a, b), max(a, b))
        division        a / b = c   ->  ("product", a, min(b, c), max(b, c))

    Within one operation the problems of a fact are exactly a pair and its swap, or a problem and its inverse (one
    problem where the two coincide, as in 3 + 3 or 6 - 3, or where the inverse is not a problem, as 0 / 0), so the
    split (data/arithmetic_split.py) keeps each fact's problems in one part. Across operations the same fact joins
    addition with subtraction (2 + 3 = 5 is 5 - 3 = 2) and multiplication with division; at operands 0-9 these
    links chain every problem together, so they cannot all be held out: `related_counts` reports how many test
    problems state a fact that another operation trains on.
"""

from __future__ import annotations

from collections.abc import Iterable

from arithmech.data.generate import solve
from arithmech.data.prompts import PromptPair
from arithmech.errors import ConfigError

Fact = tuple[str, int, int, int]
"""(kind, whole, smaller part, larger part); kind is "sum" or "product"."""


def fact_of(operation: str, a: int, b: int) -> Fact:
    """The fact the problem `a operation b` states (see the module docstring); the problem must be valid."""
    c = solve(operation, a, b)
    if c is None:
        raise ValueError(f"{a} {operation} {b} is not a problem of the split (no valid answer)")
    if operation in ("addition", "multiplication"):
        return ("sum" if operation == "addition" else "product", c, min(a, b), max(a, b))
    return ("sum" if operation == "subtraction" else "product", a, min(b, c), max(b, c))


def pair_fact(pair: PromptPair) -> Fact | None:
    """The fact a prompt's final query states, or None when it states none this module knows: no operation, operands
    that are no whole numbers (decimals, a user's prompts without them), or no valid problem."""
    if pair.operation is None or pair.a is None or pair.b is None or not (pair.a.isdigit() and pair.b.isdigit()):
        return None
    try:
        return fact_of(pair.operation, int(pair.a), int(pair.b))
    except (ValueError, ConfigError):  # not a valid problem, or not one of the four operations
        return None


def related_counts(
    test: dict[str, Iterable[tuple[int, int]]], train: dict[str, Iterable[tuple[int, int]]]
) -> dict[str, dict[str, int]]:
    """Per test operation: how many of its test problems state a fact trained in another operation, and in which.

    `test` and `train` map an operation to its problems; {op: {"test": n, "related": k, <other op>: k_other}}.
    """
    trained = {op: {fact_of(op, a, b) for a, b in problems} for op, problems in train.items()}
    out: dict[str, dict[str, int]] = {}
    for op, problems in test.items():
        facts = [fact_of(op, a, b) for a, b in problems]
        others = {other: facts_ for other, facts_ in trained.items() if other != op}
        row = {"test": len(facts), "related": sum(any(f in fs for fs in others.values()) for f in facts)}
        row.update({other: sum(f in fs for f in facts) for other, fs in others.items()})
        out[op] = row
    return out
