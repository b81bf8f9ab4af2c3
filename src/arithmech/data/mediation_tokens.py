"""Tokenize mediation pairs: token ids of base and alternative, the result tokens, and position classes.

The mediation engine (`patching/mediation.py`) swaps one component's activation position by position, so base
and alternative must have the same token length; a pair whose alternative tokenizes to another length is
rejected and counted, and so is a pair whose results differ as text but start with the same token (for a
type whose results must differ). r and r' are the first tokens of each result as it follows its prompt
(`tokens.answer_target`).

Position classes
    The pair's operand character spans (`mediation_prompts.MediationPair.spans`) and the tokenizer's offset
    mapping (fast tokenizers only) give every base token one class, in prompt order:

        early     before operand 1
        operand1  overlaps operand 1's characters
        middle    between the operands
        operand2  overlaps operand 2's characters
        late      after the last operand, before END
        last      END, the last token

    Facts have no operand 2, so middle and operand2 are empty and late starts after the subject.

Restricted accuracy
    For numeric tasks each item also carries the first tokens of the numbers 0..max_number after the base
    prompt, so accuracy can be read among numbers only.

Usage:
    >>> items, report = tokenize_mediation_pairs(tokenizer, pairs)
    >>> report.kept, report.rejected_length_mismatch
    >>> [POSITION_CLASSES[c] for c in items[0].position_class]            # "early", ..., "last"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from arithmech.data.mediation_prompts import MediationPair, Spans
from arithmech.data.tokens import answer_target
from arithmech.errors import DataError

POSITION_CLASSES: tuple[str, ...] = ("early", "operand1", "middle", "operand2", "late", "last")


@dataclass(frozen=True)
class TokenizedMediationPair:
    """One pair as token ids; base and alternative have the same length, END = the last position."""

    pair: MediationPair
    base_ids: torch.Tensor  # [pos] long
    alt_ids: torch.Tensor  # [pos] long
    result_id: int
    """First token of r after the base prompt."""
    alt_result_id: int
    """First token of r' after the alternative prompt."""
    position_class: torch.Tensor  # [pos] long, index into POSITION_CLASSES
    number_ids: tuple[int, ...] | None
    """First tokens of the numbers 0..max_number after the base prompt (None for non-numeric tasks)."""


@dataclass(frozen=True)
class MediationTokenReport:
    kept: int
    rejected_length_mismatch: int
    """Alternative prompt with another token length than the base prompt."""
    rejected_same_result_token: int
    """r and r' differ as text but start with the same token, for a type whose results must differ."""


def tokenize_mediation_pairs(
    tokenizer: Any, pairs: list[MediationPair], max_number: int | None = None
) -> tuple[list[TokenizedMediationPair], MediationTokenReport]:
    """Tokenize pairs (fast tokenizer: offsets give the position classes), rejecting and counting misfits.

    max_number: number tokens for the restricted accuracy are those of 0..max_number (None: max(9, the
    largest numeric result in `pairs`)).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise DataError("mediation position classes need a fast tokenizer (offset mapping); load a fast one")
    numbers = [int(v) for p in pairs for v in (p.base_result, p.alt_result) if v.isdigit()]
    top = max([9, *numbers]) if max_number is None else max_number
    kept: list[TokenizedMediationPair] = []
    length = same = 0
    for pair in pairs:
        base, result_id = answer_target(tokenizer, pair.base, pair.base_result)
        alt, alt_result_id = answer_target(tokenizer, pair.alternative, pair.alt_result)
        enc = tokenizer(base, return_offsets_mapping=True)
        alt_ids = list(tokenizer(alt)["input_ids"])
        if len(alt_ids) != len(enc["input_ids"]):
            length += 1
            continue
        if result_id == alt_result_id and pair.base_result != pair.alt_result:
            same += 1
            continue
        numeric = pair.task != "factual"
        number_ids = (
            tuple(dict.fromkeys(answer_target(tokenizer, pair.base, str(n))[1] for n in range(top + 1)))
            if numeric else None
        )  # fmt: skip
        offsets = [(int(s), int(e)) for s, e in enc["offset_mapping"]]
        kept.append(
            TokenizedMediationPair(
                pair, torch.tensor(enc["input_ids"]), torch.tensor(alt_ids), result_id, alt_result_id,
                torch.tensor(position_classes(offsets, pair.spans)), number_ids,
            )
        )  # fmt: skip
    return kept, MediationTokenReport(len(kept), length, same)


def position_classes(offsets: list[tuple[int, int]], spans: Spans) -> list[int]:
    """Index into POSITION_CLASSES of each token, from its [start, end) characters and the operand spans.

    A token overlapping an operand's characters is that operand; the last token is always "last"; tokens
    before operand 1 are early, between the operands middle, after the last operand late.
    """
    o1, o2 = spans.get("operand1"), spans.get("operand2")
    out = []
    for i, (start, end) in enumerate(offsets):
        if i == len(offsets) - 1:
            name = "last"
        elif o1 is not None and start < o1[1] and end > o1[0]:
            name = "operand1"
        elif o2 is not None and start < o2[1] and end > o2[0]:
            name = "operand2"
        elif o1 is None or end <= o1[0]:
            name = "early"
        elif o2 is not None and end <= o2[0]:
            name = "middle"
        else:
            name = "late"
        out.append(POSITION_CLASSES.index(name))
    return out
