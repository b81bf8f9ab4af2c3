"""Tokenize prompt pairs into the tensors every patching stage reads: ids, END positions, answers, roles.

Path patching compares the reference and counterfactual position by position, so a pair whose
counterfactual has a different token length is rejected (counted, and named in a warning), as in Zhang et
al. (2024). A pair whose answer is not one whole token, or whose counterfactual changes nothing the model
sees, is refused (`pair_checks`): its numbers would look fine and mean nothing. Batches are RIGHT-padded: a
causal model then gives each prompt exactly its unpadded result at its own last token END, and positions line
up from the start. The target token C is the answer's token as it follows the prompt (for GPT-2-like
tokenizers, which merge a space into the number, the prompt's trailing space moves into it, and a prompt
file's lines where it did are named in a warning). Token roles (operand A, operand B, operator, few-shot
prefix) come from the pairs' character spans through the tokenizer's offset mapping (fast tokenizers only).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from arithmech.data.pair_checks import (
    Findings,
    Location,
    Problem,
    answer_problem,
    answer_tokens_problem,
    counterfactual_problem,
    describe,
    pair_location,
    text_problem,
)
from arithmech.data.places import token_places
from arithmech.data.prompts import ROLE_NAMES, PromptPair
from arithmech.errors import DataError

logger = logging.getLogger(__name__)

ROLE_CODES: dict[str, int] = {"other": 0, "A": 1, "B": 2, "operator": 3, "prefix": 4}
_Row = tuple[list[int], list[int], list[int], list[int]]  # reference ids, counterfactual ids, answer ids, roles


@dataclass(frozen=True)
class TokenizedPairs:
    """Right-padded token tensors for the kept prompt pairs; row i belongs to `pairs[i]`.

    roles holds ROLE_CODES (0 other, 1 A, 2 B, 3 operator, 4 prefix) of each reference token; zeros for
    a pair without spans, and everywhere for a slow tokenizer (no offsets). `roles_available` is True only
    when every row has roles.

    With answer digits (`tokenize_pairs(..., answer_digits=True)`) a pair whose answer has m tokens t1..tm
    has m consecutive rows: row j is the reference and the counterfactual each followed by t1..t(j-1) (teacher
    forcing, the reference's answer prefix in both), its answer tj; `answer_place` is the place value of tj
    counted from the units (m - j: 0 units, 1 tens, 2 hundreds; `places.py`, which is why every token must be
    one digit) and `pair_index` numbers the pairs 0..P-1 in order (`pairs` holds each row's pair). Otherwise
    every pair is one row, at place 0.
    """

    ref_ids: torch.Tensor  # [batch, pos] long
    cf_ids: torch.Tensor  # [batch, pos] long
    ref_mask: torch.Tensor  # [batch, pos] long, 1 = real token
    cf_mask: torch.Tensor  # [batch, pos] long, equal to ref_mask (same lengths)
    end: torch.Tensor  # [batch] long, index of each prompt's own last token
    answer_ids: torch.Tensor  # [batch] long, first token of the answer C
    roles: torch.Tensor  # [batch, pos] long role codes
    pairs: list[PromptPair]
    pad_id: int
    roles_available: bool
    answer_place: torch.Tensor  # [batch] long, place value of the scored token: 0 units, 1 tens, 2 hundreds
    pair_index: torch.Tensor  # [batch] long, the row's pair, numbered 0..P-1 in order

    @property
    def n_pairs(self) -> int:
        return int(self.pair_index.max()) + 1 if len(self.pair_index) else 0

    def unique_pairs(self) -> list[PromptPair]:
        """One entry per pair (its first row's), in pair order."""
        first = torch.ones_like(self.pair_index, dtype=torch.bool)
        first[1:] = self.pair_index[1:] != self.pair_index[:-1]
        return [self.pairs[i] for i in first.nonzero().flatten().tolist()]

    def pair_rows(self, pair_numbers: list[int]) -> list[int]:
        """The rows of these pairs, pair by pair in the order given, each pair's tokens in writing order."""
        rows_of: dict[int, list[int]] = {}
        for row, pair in enumerate(self.pair_index.tolist()):
            rows_of.setdefault(pair, []).append(row)
        return [row for pair in pair_numbers for row in rows_of[pair]]

    def take_pairs(self, pair_numbers: list[int]) -> TokenizedPairs:
        """Every row of some of the pairs, in that order (`take` of `pair_rows`)."""
        return self.take(self.pair_rows(pair_numbers))

    def take(self, indices: list[int]) -> TokenizedPairs:
        """Some of the rows, in that order, trimmed to their own longest prompt; their pairs are renumbered
        0..P-1 in order of first appearance."""
        idx = torch.tensor(indices, dtype=torch.long)
        width = int(self.end[idx].max()) + 1
        picked = self.pair_index[idx].tolist()
        number: dict[int, int] = {}
        renumbered = torch.tensor([number.setdefault(p, len(number)) for p in picked], dtype=torch.long)
        return TokenizedPairs(
            ref_ids=self.ref_ids[idx, :width],
            cf_ids=self.cf_ids[idx, :width],
            ref_mask=self.ref_mask[idx, :width],
            cf_mask=self.cf_mask[idx, :width],
            end=self.end[idx],
            answer_ids=self.answer_ids[idx],
            roles=self.roles[idx, :width],
            pairs=[self.pairs[i] for i in indices],
            pad_id=self.pad_id,
            roles_available=self.roles_available,
            answer_place=self.answer_place[idx],
            pair_index=renumbered,
        )

    def role_mask(self, role: str) -> torch.Tensor:
        """[batch, pos] bool: the tokens with `role` ("A", "B", "operator", "prefix" or "other")."""
        if role not in ROLE_CODES:
            raise DataError(f"unknown token role '{role}'; use one of {', '.join(ROLE_CODES)}")
        return self.roles == ROLE_CODES[role]


@dataclass(frozen=True)
class TokenizeReport:
    """How many pairs were kept and rejected, in all and per template (None template -> "custom")."""

    kept: int
    rejected_length_mismatch: int
    per_template: dict[str, dict[str, int]] = field(default_factory=dict)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text)["input_ids"])


def answer_token_id(tokenizer: Any, prompt: str, answer: str) -> int:
    """The id of the first token of `answer` as it follows `prompt` (tokenizer's default special tokens)."""
    return answer_target(tokenizer, prompt, answer)[1]


def answer_target(tokenizer: Any, prompt: str, answer: str) -> tuple[str, int]:
    """(prompt as the model should see it, id of the answer's first token after it); see `answer_tokens`."""
    if not answer:
        raise DataError(f"the answer for prompt {prompt[-40:]!r} is empty; give the expected answer text")
    split = answer_tokens(tokenizer, prompt, answer)
    if split is None:
        raise DataError(
            f"the tokens of prompt {prompt[-40:]!r} are not a prefix of the tokens of prompt + answer "
            f"{answer!r}; end the prompt where the answer's first token starts (e.g. with a space)"
        )
    return split[0], split[1][0]


def answer_tokens(tokenizer: Any, prompt: str, answer: str) -> tuple[str, list[int]] | None:
    """(prompt as the model should see it, the answer's tokens after it), or None if the prompt's tokens are
    not a prefix of the tokens of prompt + answer.

    A tokenizer that merges the space into the number (GPT-2's " 7") cannot continue "= " with a number
    token; then the trailing whitespace moves from the prompt into the answer's token.
    """
    for head, full in ((prompt, prompt + answer), (prompt.rstrip(), prompt.rstrip() + " " + answer)):
        head_ids, full_ids = _encode(tokenizer, head), _encode(tokenizer, full)
        if len(full_ids) > len(head_ids) and full_ids[: len(head_ids)] == head_ids:
            return head, [int(i) for i in full_ids[len(head_ids) :]]
    return None


def continuation_span(
    tokenizer: Any, context: str, continuation: str, add_special_tokens: bool = True
) -> tuple[list[int], int]:
    """(tokens of context + continuation, index of the first token the continuation changes or adds).

    The concatenation is tokenized, not the two apart, so the tokenizer's own boundary holds: when the context's
    last token merges with the continuation's first characters, the span starts at that merged token (the
    lm-evaluation-harness convention; evaluate/choice.py scores choices, evaluate/arithmetic.py answers by it).
    """
    ctx = tokenizer(context, add_special_tokens=add_special_tokens)["input_ids"]
    whole = tokenizer(context + continuation, add_special_tokens=add_special_tokens)["input_ids"]
    start = 0
    while start < min(len(ctx), len(whole)) and ctx[start] == whole[start]:
        start += 1
    if start == 0:
        raise DataError(f"the context {context[:40]!r} gives no token before the continuation; give a non-empty prompt")
    if start == len(whole):
        raise DataError(f"{continuation!r} adds no token to its prompt; choices and answers must not be empty")
    return list(whole), start


def pad_id_of(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its eos id, else 0."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


def tokenize_pairs(
    tokenizer: Any,
    pairs: list[PromptPair],
    *,
    first_token_answers: bool = False,
    counterfactual_required: bool = True,
    answer_digits: bool = False,
    one_digit_tokens: bool = True,
) -> tuple[TokenizedPairs, TokenizeReport]:
    """Tokenize pairs, refuse any that breaks a rule of `pair_checks`, reject (and name) those whose
    counterfactual has another token length, and right-pad the rest.

    first_token_answers: score the first token of a longer answer instead of refusing it (transfer's
        multi-digit, decimal and word-problem targets, Zhang et al. 2024 section 5.1).
    counterfactual_required: False accepts a counterfactual equal to the reference (word problems have none;
        transfer ablates them with means).
    answer_digits: score every token of a longer answer, one row per token with the answer's earlier tokens
        appended to both prompts (teacher forcing; `TokenizedPairs`); the report counts pairs, not rows.
    one_digit_tokens: with answer_digits, refuse an answer token that is not one digit (it has no one place
        value); False accepts any tokens that spell the answer (whole-answer scoring, no per-place table; the
        rows' answer_place is then the token's index counted from the answer's end).
    """
    if first_token_answers and answer_digits:
        raise ValueError("first_token_answers and answer_digits exclude each other")
    if not pairs:
        raise DataError("there are no prompt pairs to tokenize; generate or read some prompt pairs first")
    fast = bool(getattr(tokenizer, "is_fast", False))
    rows: list[_Row] = []
    kept_pairs: list[PromptPair] = []
    counts: dict[str, Counter[str]] = {}
    findings = Findings(len(pairs))
    rejected: list[Location] = []
    moved: list[Location] = []
    example = ""  # what the model sees and is scored on, for the first prompt whose space moved
    for number, pair in enumerate(pairs, 1):
        where = pair_location(pair, number)
        checked = _tokenize_pair(tokenizer, pair, fast, first_token_answers, counterfactual_required, answer_digits,
                                 one_digit_tokens)  # fmt: skip
        if isinstance(checked, Problem):
            findings.add(where, checked)
            continue
        space_moved, row = checked
        tally = counts.setdefault(pair.template_id or "custom", Counter())
        if len(row[1]) != len(row[0]):
            tally["rejected"] += 1
            rejected.append(where)
            continue
        tally["kept"] += 1
        if space_moved and pair.source is not None:
            moved.append(where)
            example = example or f"{pair.reference.rstrip()[-20:]!r} and {tokenizer.decode([row[2][0]])!r}"
        rows.append(row)
        kept_pairs.append(pair)
    findings.refuse()
    report = TokenizeReport(
        kept=len(rows),
        rejected_length_mismatch=len(rejected),
        per_template={k: {"kept": c["kept"], "rejected": c["rejected"]} for k, c in counts.items()},
    )
    _report_changes(pairs, rejected, moved, example)
    roles_available = fast and all(p.spans for p in kept_pairs)
    return _stack(*_teacher_forced(rows, kept_pairs), pad_id_of(tokenizer), roles_available), report


def _teacher_forced(
    rows: list[_Row], pairs: list[PromptPair]
) -> tuple[list[_Row], list[PromptPair], list[int], list[int]]:
    """One row per answer token: row j of a pair is its prompts followed by the answer's tokens before the j-th
    (teacher forcing), scored on the j-th. Also each row's pair and the place value of its token (`places.py`)."""
    out: list[_Row] = []
    out_pairs, places, pair_index = [], [], []
    for number, ((ref, cf, answer, roles), pair) in enumerate(zip(rows, pairs, strict=True)):
        for j, (token, place) in enumerate(zip(answer, token_places(len(answer)), strict=True)):
            out.append((ref + answer[:j], cf + answer[:j], [token], roles + [0] * j))
            out_pairs.append(pair)
            places.append(place)
            pair_index.append(number)
    return out, out_pairs, places, pair_index


def _tokenize_pair(
    tokenizer: Any,
    pair: PromptPair,
    fast: bool,
    first_token_answers: bool,
    counterfactual_required: bool,
    answer_digits: bool = False,
    one_digit_tokens: bool = True,
) -> Problem | tuple[bool, _Row]:
    """The rule of `pair_checks` the pair breaks, or (whether its trailing space moved into the answer, its row)."""
    problem = text_problem(pair, counterfactual_required)
    split = None if problem else answer_tokens(tokenizer, pair.reference, pair.answer)
    if problem or split is None:
        return problem or _NOT_A_PREFIX
    reference, answer_ids = split
    if answer_digits:
        problem = answer_tokens_problem(tokenizer, pair, answer_ids, one_digit_tokens)
    elif not first_token_answers:
        problem = answer_problem(tokenizer, pair, answer_ids)
    if problem:
        return problem
    counterfactual = pair.counterfactual if reference == pair.reference else pair.counterfactual.rstrip()
    ref_ids, offsets = _encode_with_offsets(tokenizer, reference, fast)
    cf_ids = _encode(tokenizer, counterfactual)
    if counterfactual_required and (problem := counterfactual_problem(pair, ref_ids, cf_ids)):
        return problem
    roles = _roles(offsets, pair.spans) if offsets else [0] * len(ref_ids)
    return reference != pair.reference, (ref_ids, cf_ids, answer_ids if answer_digits else answer_ids[:1], roles)


_NOT_A_PREFIX = Problem(
    "the reference's tokens are not a prefix of the tokens of reference + answer",
    "the answer merges with the reference's last token",
    "end the reference where the answer's first token starts (e.g. with a space)",
)


def _report_changes(pairs: list[PromptPair], rejected: list[Location], moved: list[Location], example: str) -> None:
    """Refuse a set whose every pair was rejected; name the rejected pairs, and the prompts whose trailing
    space moved into the answer's token."""
    why = "the counterfactual has a different token length than the reference"
    if len(rejected) == len(pairs):
        raise DataError(
            f"all {len(pairs)} prompt pairs were rejected because {why}: {describe(rejected, len(pairs))}; "
            "choose a counterfactual operator with the same number of tokens"
        )
    if rejected:
        logger.warning(
            "%s: rejected, since %s (path patching compares them position by position)",
            describe(rejected, len(pairs)),
            why,
        )
    if moved:
        logger.warning(
            "%s: the reference's trailing space moved into the answer's token, since this tokenizer merges a "
            "space into the number (the model sees and is scored on %s)",
            describe(moved, len(pairs)),
            example,
        )


def _encode_with_offsets(tokenizer: Any, text: str, fast: bool) -> tuple[list[int], list[tuple[int, int]]]:
    if not fast:
        return _encode(tokenizer, text), []
    enc = tokenizer(text, return_offsets_mapping=True)
    return list(enc["input_ids"]), [(int(s), int(e)) for s, e in enc["offset_mapping"]]


def _roles(offsets: list[tuple[int, int]], spans: dict[str, tuple[int, int]]) -> list[int]:
    """Role code per token: a token takes a role if its characters overlap that role's span.

    Special tokens have empty offsets and stay "other"; a token overlapping several spans takes the first
    of A, B, operator, prefix.
    """
    codes = []
    for start, end in offsets:
        code = 0
        for role in ROLE_NAMES:
            span = spans.get(role)
            if span is not None and start < span[1] and end > span[0]:
                code = ROLE_CODES[role]
                break
        codes.append(code)
    return codes


def _stack(
    rows: list[_Row],
    pairs: list[PromptPair],
    places: list[int],
    pair_index: list[int],
    pad_id: int,
    roles_available: bool,
) -> TokenizedPairs:
    """Right-pad the rows (one answer token each) into [batch, pos] tensors."""
    width = max(len(ref) for ref, _, _, _ in rows)
    batch = len(rows)
    ref_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    cf_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    roles = torch.zeros((batch, width), dtype=torch.long)
    for i, (ref, cf, _, role_codes) in enumerate(rows):
        n = len(ref)
        ref_ids[i, :n] = torch.tensor(ref, dtype=torch.long)
        cf_ids[i, :n] = torch.tensor(cf, dtype=torch.long)
        mask[i, :n] = 1
        roles[i, :n] = torch.tensor(role_codes, dtype=torch.long)
    return TokenizedPairs(
        ref_ids=ref_ids,
        cf_ids=cf_ids,
        ref_mask=mask,
        cf_mask=mask.clone(),
        end=mask.sum(dim=1) - 1,  # [batch]
        answer_ids=torch.tensor([answer[0] for _, _, answer, _ in rows], dtype=torch.long),
        roles=roles,
        pairs=pairs,
        pad_id=pad_id,
        roles_available=roles_available,
        answer_place=torch.tensor(places, dtype=torch.long),
        pair_index=torch.tensor(pair_index, dtype=torch.long),
    )
