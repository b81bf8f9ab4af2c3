"""The facts of MIB's arithmetic prompts and how many prompts each part holds, without torch or a tokenizer.

A fact is the unordered operand pair {x, y} of an addition triple x + y = z, so "x plus y", "y plus x",
"z minus x" and "z minus y" are one fact; a seeded hash puts each fact in the find or the test part
(`data/mib_arithmetic.py` explains the split and draws the prompts). Kept apart from the prompt stream so that the
circuit stage's settings can say, before the model loads, how many prompts the generator can give
(`distinct_prompts`): a prompt is one ordered operand pair (a >= b for subtraction), whatever the model.
"""

from __future__ import annotations

import hashlib

PARTS = ("find", "test")
"""The two parts of the built-in prompts: edges are scored on the find part, circuits evaluated on the test part."""
EXACT_COUNT_LIMIT = 40_000
"""Operand pairs counted one by one (about 40 ms); beyond, a part holds half of them (the hash splits evenly)."""


def fact(operation: str, a: int, b: int) -> tuple[int, int]:
    """The fact of "a {op} b" as its addition triple's unordered operands {x, y} (x <= y): a + b has {a, b};
    a - b = c has {b, c} (b + c = a)."""
    x, y = (a, b) if operation == "addition" else (b, a - b)
    return min(x, y), max(x, y)


def fact_part(operation: str, a: int, b: int, seed: int) -> str:
    """"find" or "test": the part the fact of "a {op} b" belongs to, by the seeded hash of the module docstring of
    `data/mib_arithmetic.py`."""
    x, y = fact(operation, a, b)
    digest = hashlib.sha256(f"mib-fact-{seed}-{x}-{y}".encode()).digest()
    return "test" if digest[0] < 128 else "find"


def distinct_prompts(operation: str, max_operand: int, seed: int, part: str | None) -> int:
    """How many different prompts of `operation` with operands 0..max_operand the stream of `part` (None: every
    fact) can give: ordered operand pairs (a >= b for subtraction) whose fact belongs to the part. Counted exactly
    up to EXACT_COUNT_LIMIT operand pairs, else estimated as half of them per part."""
    n = max_operand + 1
    pairs = n * n if operation == "addition" else n * (n + 1) // 2
    if part is None:
        return pairs
    if pairs > EXACT_COUNT_LIMIT:
        return pairs // 2
    return sum(1 for a in range(n) for b in range(n) if (operation == "addition" or a >= b)
               and fact_part(operation, a, b, seed) == part)  # fmt: skip
