"""MIB's arithmetic prompts (circuit track, arithmetic_addition / arithmetic_subtraction), built locally.

Format: "Q: How much is {A} plus {B}? A:" (subtraction: "minus"), answer " {C}"; the counterfactual is the same
template with new random operands (MIB's counterfactual for arithmetic), its answer C'. Operands are drawn
from 0..max_operand by a local seeded RNG; subtraction keeps A >= B so that answers are not negative.

Scored token (documented rule): the first token of the answer that carries a digit. Tokenizers that split
numbers into digits (SmolLM2) also split the space before them into a token of its own, which would be the
same for every answer; so the prompt keeps that space ("... A: ") and the scored token is the answer's first
digit. Tokenizers that merge the space into the number (GPT-2) get the prompt without it and score " C"'s
first token (`data.tokens.answer_tokens` decides, from the tokenizer itself). A two-digit answer on a
digit-splitting tokenizer is thus scored by its leading digit, and C' by its own leading digit; pairs whose two
scored tokens are equal carry no signal and are dropped, as are pairs whose prompts differ in token length
(edges are patched position by position).

References: Mueller et al. 2025 (MIB), arithmetic task; Stolfo et al. 2023 (the templates' origin).
"""

from __future__ import annotations

import random
from typing import Any

from arithmech.data.prompts import PromptPair
from arithmech.data.tokens import answer_tokens
from arithmech.errors import ConfigError

MIB_TEMPLATE = "Q: How much is {A} {op} {B}? A:"
MIB_OPERATIONS: dict[str, str] = {"addition": "plus", "subtraction": "minus"}


def _draw(rng: random.Random, operation: str, max_operand: int) -> tuple[int, int, int]:
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    if operation == "subtraction" and a < b:
        a, b = b, a
    return a, b, a + b if operation == "addition" else a - b


def _render(operation: str, a: int, b: int) -> str:
    return MIB_TEMPLATE.format(A=a, B=b, op=MIB_OPERATIONS[operation])


def mib_pairs(
    tokenizer: Any, operation: str, n: int, seed: int = 0, max_operand: int = 99, tries: int = 20
) -> list[PromptPair]:
    """Up to `n` clean/counterfactual pairs of equal token length whose scored answer tokens differ.

    Each pair's `extra` holds the scored token ids ("answer_id", "cf_answer_id") and the counterfactual answer
    ("cf_answer"); `reference` / `counterfactual` are the prompts as the model sees them (with the split-off
    space when the tokenizer splits it).
    """
    if operation not in MIB_OPERATIONS:
        raise ConfigError(f"operation {operation!r} has no MIB prompts; choose from {', '.join(MIB_OPERATIONS)}")
    rng = random.Random(f"mib-{operation}-{seed}")
    pairs: list[PromptPair] = []
    for _ in range(n * tries):
        if len(pairs) == n:
            break
        pair = _pair(tokenizer, operation, rng, max_operand)
        if pair is not None:
            pairs.append(pair)
    return pairs


def _pair(tokenizer: Any, operation: str, rng: random.Random, max_operand: int) -> PromptPair | None:
    a, b, c = _draw(rng, operation, max_operand)
    a2, b2, c2 = _draw(rng, operation, max_operand)
    clean = _scored(tokenizer, _render(operation, a, b), c)
    cf = _scored(tokenizer, _render(operation, a2, b2), c2)
    if clean is None or cf is None or clean[2] != cf[2] or clean[1] == cf[1]:
        return None
    return PromptPair(
        reference=clean[0], counterfactual=cf[0], answer=str(c), operation=operation, a=str(a), b=str(b),
        extra={"cf_answer": str(c2), "answer_id": clean[1], "cf_answer_id": cf[1]},
    )  # fmt: skip


def _scored(tokenizer: Any, prompt: str, answer: int) -> tuple[str, int, int] | None:
    """(prompt as the model sees it, id of the answer's first token, prompt length in tokens), or None when that
    token carries no digit. `answer_tokens` keeps the space in the prompt where the tokenizer splits it off."""
    split = answer_tokens(tokenizer, prompt + " ", str(answer))
    if split is None:
        return None
    head, ids = split
    if not any(ch.isdigit() for ch in tokenizer.decode([ids[0]])):
        return None
    return head, ids[0], len(tokenizer(head)["input_ids"])
