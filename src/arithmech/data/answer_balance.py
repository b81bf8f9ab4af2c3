"""Samples in which one answer value dominates: queries drawn evenly over answer values, and a warning.

Why
    With some operand ranges one answer holds most of the valid problems: division with operands 10-99 has
    196 exact problems, 90 of them n / n = 1; multiplication with operands 0-9 and a one-digit answer has 42,
    19 of them 0. Queries drawn evenly over problems inherit that share, so a model that always writes the
    common answer is right that often, and effects measured on the sample are mostly those of one answer.

What is done
    - Where the generator enumerates the problems (ranges up to 200 operand values, `data/generate.py`) and
      one answer holds more than DOMINANT_SHARE of them, the queries are drawn evenly over the answer values
      (`AnswerCycle`: a shuffled cycle of the values, and for each value a shuffled cycle of its problems, from
      the template's own seeded RNG); solved examples are drawn from all problems as before.
    - A set of prompts in which one answer still holds more than DOMINANT_SHARE of an operation's prompts (at
      least MIN_PROMPTS of them) is named in one warning with that share (`warn_dominant`): generated prompts
      where the range is too large to enumerate, and the reference set after it keeps only the prompts the
      model answers (a model that answers only the easy n / n = 1 keeps mostly those).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence

from arithmech.data.prompts import PromptPair

logger = logging.getLogger(__name__)

DOMINANT_SHARE = 0.4
"""An answer held by more than this share of a set's prompts (or problems) dominates it."""
MIN_PROMPTS = 5
"""Fewer prompts of an operation are too few to call one answer dominant."""

Problem = tuple[int, int]


def dominant(values: Sequence[object]) -> tuple[object, int] | None:
    """The most common value and its count, when it holds more than DOMINANT_SHARE of at least MIN_PROMPTS."""
    if len(values) < MIN_PROMPTS:
        return None
    value, count = Counter(values).most_common(1)[0]
    return (value, count) if count > DOMINANT_SHARE * len(values) else None


def warn_dominant(pairs: Sequence[PromptPair], what: str, fix: str) -> None:
    """One warning per operation whose prompts in `pairs` one answer dominates (`what` names the set, `fix` says
    what to do)."""
    for operation in dict.fromkeys(p.operation for p in pairs):
        answers = [p.answer for p in pairs if p.operation == operation]
        found = dominant(answers)
        if found is not None:
            answer, count = found
            logger.warning(
                "%s: %d of the %d %s prompts (%.0f%%) have the answer %s, so a model that always writes %s is "
                "right on %.0f%% of them, and their effects are mostly those of this one answer; %s",
                what, count, len(answers), operation or "custom", 100 * count / len(answers), answer, answer,
                100 * count / len(answers), fix,
            )  # fmt: skip


class AnswerCycle:
    """Queries drawn evenly over answer values (see the module docstring)."""

    def __init__(self, by_answer: dict[int, list[Problem]]) -> None:
        self._by_answer = by_answer
        self._values: list[int] = []
        self._queues: dict[int, list[Problem]] = {value: [] for value in by_answer}

    def next_query(self, rng: random.Random) -> Problem:
        if not self._values:
            self._values = sorted(self._by_answer)
            rng.shuffle(self._values)
        value = self._values.pop()
        if not self._queues[value]:
            self._queues[value] = list(self._by_answer[value])
            rng.shuffle(self._queues[value])
        return self._queues[value].pop()
