"""The unit of task data: a reference prompt, its counterfactual, and the answer's text.

Generated pairs and pairs read from a user's file are the same type, so every later stage (patching,
knockout, attention analysis) takes one kind of input. Character spans of the final query's operands and
operator travel with the pair, so token roles can be recovered after tokenization.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROLE_NAMES: tuple[str, ...] = ("A", "B", "operator", "prefix")


@dataclass(frozen=True)
class PromptPair:
    """A reference prompt X_r, its counterfactual X_c (operator replaced) and the answer text C.

    `spans` maps "A", "B", "operator" (the final query's) and "prefix" (the few-shot examples) to
    [start, end) character offsets in `reference`; it may be empty for user-supplied prompts. `source` and
    `line` say where a pair read from a file came from, so a message can name the line; they are not data
    (not compared, not written back).
    """

    reference: str
    counterfactual: str
    answer: str
    template_id: str | None = None
    operation: str | None = None
    formation: str | None = None
    a: str | None = None
    b: str | None = None
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    source: str | None = field(default=None, compare=False, repr=False)
    line: int | None = field(default=None, compare=False, repr=False)

    def span_text(self, role: str) -> str:
        """The substring of `reference` that `spans[role]` points at."""
        start, end = self.spans[role]
        return self.reference[start:end]
