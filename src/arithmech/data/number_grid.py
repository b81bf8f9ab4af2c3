"""Prompts over an operand range, their operand tokens per place, and corrupted partners for the numbers stage.

Background
    The numbers stage reads the residual stream at each operand's tokens over prompts that vary a and b, and
    judges a fit by patching it into a run whose operand was changed (Kantamneni & Tegmark 2025). Two cases:
    - single-token numbers (the whole range low..high-1 is one token each): one site per operand, "a" and
      "b", plus "last" (the prompt's last token);
    - a tokenizer that splits numbers into digits: operands of one length D (e.g. 10..99), one site per place
      of each, "a.tens", "a.units", ..., so that each place's digit has its own representation to fit (Levy &
      Geva 2025), plus "last". A place token sees only the digits written so far (causal attention).

Prompts
    One template; every prompt has the same few-shot prefix of solved examples (drawn once, seeded, never
    queried, nor their swaps), so prompts differ only in the final query's operands and line up position by
    position. The grid is every valid pair (a, b) of the range (a seeded sample above max_pairs).

Corrupted partners (`partner`)
    For a site of operand X and place p (None for a whole-number token or "last"): X is changed to X' that
    differs from X in place p only (any other value in the range when p is None), the other operand kept;
    X' is drawn (seeded per prompt and site) among the values whose answer has the same token count. The
    clean and corrupted answers are compared token by token: the first token j where they differ is read,
    and the answer's tokens before j (equal in both) are appended to both prompts (teacher forcing). So a
    change of a's units digit is read at the answer's units digit, with its tens digit given.

Usage
    >>> grid = number_grid(tokenizer, template, low=10, high=100, few_shot=3, max_pairs=256, seed=0)
    >>> grid.sites                       # ["a.tens", "a.units", "b.tens", "b.units", "last"]
    >>> grid.prompts[0].positions["a.units"]
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from arithmech.data.generate import build_pair, solve
from arithmech.data.number_tokens import single_token_numbers
from arithmech.data.places import place_name
from arithmech.data.prompts import PromptPair
from arithmech.data.templates import Template
from arithmech.data.tokens import answer_tokens
from arithmech.errors import ConfigError, DataError


@dataclass(frozen=True)
class Site:
    """A position the stage reads: its name, the operand whose value is fitted there, and the place changed by
    its corruption (None: the whole operand)."""

    name: str
    operand: str  # "a" or "b"
    place: int | None  # 0 units, 1 tens, ...; None: a whole-number token or the last token
    token: str  # "a", "b" or "last": which token list the position comes from


@dataclass(frozen=True)
class NumberPrompt:
    """One tokenized prompt: its operands, answer tokens and the token position of every site."""

    a: int
    b: int
    result: int
    ids: list[int]  # the prompt as the model sees it
    answer: list[int]  # the answer's tokens after it
    positions: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class NumberGrid:
    """The prompts of the grid and what they share."""

    template: Template
    low: int
    high: int
    digit_split: bool
    examples: list[tuple[int, int]]
    prompts: list[NumberPrompt]
    sites: list[Site]
    valid: int  # valid pairs of the whole range


def operand_mode(tokenizer: Any, context: str, low: int, high: int) -> bool:
    """True when the range is read per digit (a digit-splitting tokenizer), False when every operand of it is
    one token; ConfigError when the tokenizer gives neither."""
    numbers = single_token_numbers(tokenizer, context, limit=max(high, 11))
    if high <= numbers.count:
        return False
    if numbers.digit_splitting:
        if len(str(low)) != len(str(high - 1)):
            raise ConfigError(
                f"operands {low}..{high - 1} have different numbers of digits, so their digit tokens do not line up; "
                f"choose a range of one length, e.g. low {10 ** (len(str(high - 1)) - 1)}"
            )
        return True
    raise ConfigError(
        f"operands {low}..{high - 1} are not all single tokens here (only 0..{numbers.count - 1} are) and the "
        f"tokenizer does not split numbers into digits; choose high {numbers.count} or less"
    )


def default_range(tokenizer: Any, template: Template, low: int | None, high: int | None) -> tuple[int, int]:
    """(low, high) with the defaults filled in: 0..min(100, N)-1 when the tokenizer has N single-token numbers
    (N > 10), else the two-digit operands 10..99 read per digit."""
    context = template.render("1", "1").text
    numbers = single_token_numbers(tokenizer, context, limit=101)
    if numbers.digit_splitting:
        hi = high if high is not None else 100
        lo = low if low is not None else (10 ** (len(str(hi - 1)) - 1) if hi > 10 else 0)
    else:
        lo, hi = (low if low is not None else 0), (high if high is not None else min(100, numbers.count))
    if hi < lo + 2:
        raise ConfigError(f"operands {lo}..{hi - 1} leave fewer than 2 values; choose high above {lo + 1}")
    return lo, hi


def sites_of(digit_split: bool, high: int) -> list[Site]:
    """The sites of the module docstring, in position order."""
    if not digit_split:
        return [Site("a", "a", None, "a"), Site("b", "b", None, "b"), Site("last", "a", None, "last")]
    places = len(str(high - 1))
    out = [Site(f"{op}.{place_name(place)}", op, place, op) for op in ("a", "b")
           for place in range(places - 1, -1, -1)]  # fmt: skip
    return [*out, Site("last", "a", None, "last")]


def _tokenize(tokenizer: Any, pair: PromptPair, sites: list[Site], digit_split: bool) -> NumberPrompt | str:
    """The prompt's tokens and site positions, or why it cannot be used."""
    split = answer_tokens(tokenizer, pair.reference, pair.answer)
    if split is None:
        return "the answer merges with the prompt's last token"
    text, answer = split
    enc = tokenizer(text, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    tokens: dict[str, list[int]] = {}
    for role in ("A", "B"):
        start, end = pair.spans[role]
        tokens[role.lower()] = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
    positions: dict[str, int] = {}
    for site in sites:
        if site.token == "last":
            positions[site.name] = len(ids) - 1
            continue
        own = tokens[site.token]
        digits = len(pair.a if site.token == "a" else pair.b or "")
        if digit_split:
            if len(own) != digits:
                return f"operand {site.token} is not one token per digit"
            positions[site.name] = own[digits - 1 - (site.place or 0)]
        else:
            if len(own) != 1:
                return f"operand {site.token} is not one token"
            positions[site.name] = own[0]
    return NumberPrompt(int(pair.a or 0), int(pair.b or 0), int(pair.answer), ids, answer, positions)


def number_grid(
    tokenizer: Any, template: Template, low: int, high: int, few_shot: int, max_pairs: int, seed: int
) -> NumberGrid:
    """The grid of the module docstring; ConfigError when the range gives too few problems, DataError when the
    tokenizer does not give its operands as the stage needs."""
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError("the numbers stage needs a fast tokenizer (its offsets locate the operand tokens)")
    pool = [(a, b) for a in range(low, high) for b in range(low, high) if (solve(template.operation, a, b) or -1) >= 0]
    if len(pool) <= few_shot + 1:
        raise ConfigError(
            f"operands {low}..{high - 1} give only {len(pool)} {template.operation} problems, too few for "
            f"{few_shot} few-shot examples and queries; use a wider range or fewer examples"
        )
    rng = random.Random(f"{seed}:number-grid:{template.id}")
    examples = rng.sample(pool, few_shot)
    held = {*examples, *((b, a) for a, b in examples)}
    rest = [p for p in pool if p not in held]
    chosen = rest if len(rest) <= max_pairs else [rest[i] for i in sorted(rng.sample(range(len(rest)), max_pairs))]
    context = build_pair(template, chosen[0], examples).reference
    digit_split = operand_mode(tokenizer, context, low, high)
    sites = sites_of(digit_split, high)
    prompts, problems = [], set()
    for a, b in chosen:
        made = _tokenize(tokenizer, build_pair(template, (a, b), examples), sites, digit_split)
        if isinstance(made, str):
            problems.add(made)
        else:
            prompts.append(made)
    if not prompts:
        raise DataError(f"no prompt of operands {low}..{high - 1} can be read: {'; '.join(sorted(problems))}")
    for site in sites:
        if site.token != "last" and len({p.positions[site.name] for p in prompts}) > 1:
            raise DataError(f"the tokens of {site.name} fall at different positions in different prompts; use "
                            "operands of one length")  # fmt: skip
    return NumberGrid(template, low, high, digit_split, list(examples), prompts, sites, len(pool))


def _changed(value: int, place: int | None, low: int, high: int) -> list[int]:
    """The values X' of the range that a corruption of `place` may give X (place None: any other value)."""
    if place is None:
        return [v for v in range(low, high) if v != value]
    step = 10**place
    digit = (value // step) % 10
    return [v for v in (value + (d - digit) * step for d in range(10) if d != digit) if low <= v < high]


@dataclass(frozen=True)
class Partner:
    """A clean prompt's corrupted partner at one site: its tokens and what is read."""

    value: int  # X' (the changed operand)
    ids: list[int]  # corrupted prompt + the forced answer tokens
    clean_ids: list[int]  # clean prompt + the same forced tokens
    good: int  # the clean answer's token at the read position
    bad: int  # the corrupted answer's token there


def partner(tokenizer: Any, grid: NumberGrid, prompt: NumberPrompt, site: Site, seed: int) -> Partner | None:
    """The corrupted partner of `prompt` at `site` (module docstring), or None when the range has none."""
    clean_value = prompt.a if site.operand == "a" else prompt.b
    candidates = _changed(clean_value, site.place, grid.low, grid.high)
    rng = random.Random(f"{seed}:numbers-partner:{site.name}:{prompt.a}:{prompt.b}")
    rng.shuffle(candidates)
    for value in candidates[:20]:
        a, b = (value, prompt.b) if site.operand == "a" else (prompt.a, value)
        if solve(grid.template.operation, a, b) is None or (solve(grid.template.operation, a, b) or 0) < 0:
            continue
        pair = build_pair(grid.template, (a, b), grid.examples)
        split = answer_tokens(tokenizer, pair.reference, pair.answer)
        if split is None:
            continue
        ids = list(tokenizer(split[0])["input_ids"])
        answer = split[1]
        if len(ids) != len(prompt.ids) or len(answer) != len(prompt.answer):
            continue
        differ = [i for i, (x, y) in enumerate(zip(prompt.answer, answer, strict=True)) if x != y]
        if not differ:
            continue
        j = differ[0]
        forced = prompt.answer[:j]
        return Partner(value, ids + forced, prompt.ids + forced, prompt.answer[j], answer[j])
    return None
