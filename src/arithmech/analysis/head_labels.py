"""Operand, operator or neither: the label of a key head from where its END row puts its attention.

Zhang et al. (2024, section 4.2, Figure 5) call a key head an operand head when the last token (END) reads
mostly from the numbers A and B, and an operator head when it reads mostly from "+", "plus", "-", ...
`analysis/attention.py` measures the mean mass of END's attention on each token role; this module holds the
rule that names the head, and its threshold, apart from torch: the analyze-attention config checks tau
before a model loads.

Labelling rule (`label_head`), with operand = score[A] + score[B] and threshold tau (default 0.3):
    operand head   if operand  >= tau and operand  > operator
    operator head  if operator >= tau and operator > operand
    neither        otherwise (also when both pass tau with exactly equal mass)
    tau = 0.3 means "at least 30% of END's attention goes to that role"; a head spreading its mass over
    the few-shot prefix or the BOS "sink" is neither.

Usage
    >>> label_head({"A": 0.2, "B": 0.2, "operator": 0.1, "prefix": 0.4, "other": 0.1})
    'operand'

References: Zhang et al., ICML 2024, section 4.2, Figure 5; METHODS.md section 4.
"""

from __future__ import annotations

from collections.abc import Mapping

LABELS: tuple[str, ...] = ("operand", "operator", "neither")
DEFAULT_TAU = 0.3


def label_head(scores: Mapping[str, float], tau: float = DEFAULT_TAU) -> str:
    """The label of a head, "operand", "operator" or "neither", from its mean mass per role (module docstring)."""
    operand = scores["A"] + scores["B"]
    operator = scores["operator"]
    if operand >= tau and operand > operator:
        return "operand"
    if operator >= tau and operator > operand:
        return "operator"
    return "neither"
