"""MIB's arithmetic prompts (circuit track, arithmetic_addition / arithmetic_subtraction), built locally.

Format: "Q: How much is {A} plus {B}? A:" (subtraction: "minus"), answer " {C}"; the counterfactual is the same
template with new random operands (MIB's "random_counterfactual"), its answer C'. Operands are drawn from
0..max_operand by a local seeded RNG; subtraction keeps A >= B so that answers are not negative.

Pairs are made from a stream of single prompts (`mib_prompt_stream`) by `PromptPairer`: each prompt becomes the
counterfactual of the earliest unpaired prompt before it of equal token length and another scored token. A
counterfactual is thus still a prompt with independent random operands; but a caller that keeps only prompts
the model answers (`circuits/prompts.answered_pairs`) pairs those, instead of drawing pairs and losing every
pair where either prompt is missed (on SmolLM2-135M with operands up to 99, 1 drawn addition pair in 256 had both
prompts answered, against 1 prompt in 9 to 11).

Scored token (documented rule): the first token of the answer that carries a digit. Tokenizers that split
numbers into digits (SmolLM2) also split the space before them into a token of its own, which would be the
same for every answer; so the prompt keeps that space ("... A: ") and the scored token is the answer's first
digit. Tokenizers that merge the space into the number (GPT-2) get the prompt without it and score " C"'s
first token (`data.tokens.answer_tokens` decides, from the tokenizer itself). A two-digit answer on a
digit-splitting tokenizer is thus scored by its leading digit, and C' by its own leading digit; pairs whose two
scored tokens are equal carry no signal and are dropped, as are pairs whose prompts differ in token length
(edges are patched position by position).

Find and test parts (held-out evaluation): a circuit is found (its edges scored) on one set of pairs and its
faithfulness measured on another, as MIB finds on its train split and evaluates on validation. The built-in prompts
are split by *fact*, not by pair: a fact is the unordered operand pair {x, y} of an addition triple x + y = z,
so "a plus b", "b plus a", "z minus x" and "z minus y" are one fact (the same triple, read four ways). Rule
(`fact_part`, in the torch-free `data/mib_facts.py`): the fact {x, y} (x <= y) goes to the test part when the
first byte of sha256("mib-fact-{seed}-{x}-{y}") is below 128 (half the facts, by a hash of the seed, independent of the
order prompts are drawn in), else to the find part. `mib_prompt_stream(part=...)` yields only prompts of that
part's facts, and `PromptPairer` pairs prompts of one stream only, so a clean prompt and its counterfactual
both come from one part: no prompt text and no fact (of a clean or a counterfactual prompt) is shared between
the find and the test pairs, across operations too (pooled addition and subtraction share one rule). `part=None`
draws from every fact, as before the split (`--in-sample`).

References: Mueller et al. 2025 (MIB), arithmetic task; Stolfo et al. 2023 (the templates' origin).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from arithmech.data.mib_facts import PARTS, fact_part
from arithmech.data.prompts import PromptPair
from arithmech.data.tokens import answer_tokens
from arithmech.errors import ConfigError

MIB_TEMPLATE = "Q: How much is {A} {op} {B}? A:"
MIB_OPERATIONS: dict[str, str] = {"addition": "plus", "subtraction": "minus"}


@dataclass(frozen=True)
class MibPrompt:
    """One prompt of MIB's template as the model sees it, with its answer and the answer's scored token."""

    text: str
    answer: str
    a: int
    b: int
    answer_id: int
    length: int
    """Tokens of `text`: a counterfactual must have as many (edges are patched position by position)."""


def _draw(rng: random.Random, operation: str, max_operand: int) -> tuple[int, int, int]:
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    if operation == "subtraction" and a < b:
        a, b = b, a
    return a, b, a + b if operation == "addition" else a - b


def _render(operation: str, a: int, b: int) -> str:
    return MIB_TEMPLATE.format(A=a, B=b, op=MIB_OPERATIONS[operation])


def check_operation(operation: str) -> None:
    if operation not in MIB_OPERATIONS:
        raise ConfigError(f"operation {operation!r} has no MIB prompts; choose from {', '.join(MIB_OPERATIONS)}")


def mib_prompt_stream(
    tokenizer: Any, operation: str, seed: int = 0, max_operand: int = 99, part: str | None = None
) -> Iterator[MibPrompt]:
    """Endless seeded prompts with random operands (those whose scored token carries no digit are skipped); with
    `part` ("find" or "test") only the prompts whose fact belongs to that part (`fact_part`)."""
    check_operation(operation)
    if part is not None and part not in PARTS:
        raise ConfigError(f"part {part!r} is not one of {', '.join(PARTS)}")
    rng = random.Random(f"mib-{operation}-{seed}")
    while True:
        a, b, c = _draw(rng, operation, max_operand)
        if part is not None and fact_part(operation, a, b, seed) != part:
            continue
        scored = scored_prompt(tokenizer, _render(operation, a, b), str(c))
        if scored is not None:
            yield MibPrompt(text=scored[0], answer=str(c), a=a, b=b, answer_id=scored[1], length=scored[2])


def widest_prompt_tokens(tokenizer: Any, operation: str, max_operand: int = 99) -> int:
    """Tokens of the widest prompt `mib_prompt_stream` draws: both operands the number of 0..max_operand written in
    the most tokens (the largest of those), as the usual tokenizers split a number apart from its neighbours."""
    check_operation(operation)
    widest = max(range(max_operand + 1), key=lambda n: (len(tokenizer(f" {n}")["input_ids"]), n))
    text = _render(operation, widest, widest)
    scored = scored_prompt(tokenizer, text, str(2 * widest if operation == "addition" else 0))
    return len(tokenizer(text if scored is None else scored[0])["input_ids"])


class PromptPairer:
    """Pairs prompts as they come: a prompt is the counterfactual of the earliest unpaired one before it of equal
    token length and another scored token (pairs whose scored tokens are equal carry no signal)."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.waiting: dict[int, list[MibPrompt]] = {}

    def add(self, prompt: MibPrompt) -> PromptPair | None:
        pool = self.waiting.setdefault(prompt.length, [])
        for i, clean in enumerate(pool):
            if clean.answer_id != prompt.answer_id:
                del pool[i]
                return PromptPair(
                    reference=clean.text, counterfactual=prompt.text, answer=clean.answer, operation=self.operation,
                    a=str(clean.a), b=str(clean.b),
                    extra={"cf_answer": prompt.answer, "answer_id": clean.answer_id, "cf_answer_id": prompt.answer_id,
                           "cf_a": prompt.a, "cf_b": prompt.b},
                )  # fmt: skip
        pool.append(prompt)
        return None


def mib_pairs(
    tokenizer: Any,
    operation: str,
    n: int,
    seed: int = 0,
    max_operand: int = 99,
    tries: int = 20,
    part: str | None = None,
) -> list[PromptPair]:
    """Up to `n` clean/counterfactual pairs of equal token length whose scored answer tokens differ, from at most
    n x `tries` prompts (of `part`'s facts only, when given).

    Each pair's `extra` holds the scored token ids ("answer_id", "cf_answer_id"), the counterfactual answer
    ("cf_answer") and operands ("cf_a", "cf_b"); `reference` / `counterfactual` are the prompts as the model sees
    them (with the split-off space when the tokenizer splits it).
    """
    pairer = PromptPairer(operation)
    pairs: list[PromptPair] = []
    stream = mib_prompt_stream(tokenizer, operation, seed, max_operand, part)
    for _ in range(n * tries):
        pair = pairer.add(next(stream))
        if pair is not None:
            pairs.append(pair)
            if len(pairs) == n:
                break
    return pairs


def scored_prompt(tokenizer: Any, prompt: str, answer: str) -> tuple[str, int, int] | None:
    """(prompt as the model sees it, id of the answer's first token, prompt length in tokens), or None when that
    token carries no digit. `answer_tokens` keeps the space in the prompt where the tokenizer splits it off."""
    split = answer_tokens(tokenizer, prompt.rstrip() + " ", answer)
    if split is None:
        return None
    head, ids = split
    if not any(ch.isdigit() for ch in tokenizer.decode([ids[0]])):
        return None
    return head, ids[0], len(tokenizer(head)["input_ids"])
