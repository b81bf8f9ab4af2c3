"""The analyze-fourier stage's settings (stages/fourier.py runs them), importable without torch.

The CLI builds `arithmech analyze fourier`'s options from these fields and validates them before a model loads;
what needs the model (layers that exist, numbers the tokenizer has, cutoffs among their frequencies) is
checked by the stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.errors import ConfigError

GROUPS: tuple[str, ...] = ("attention", "mlp")
"""Component groups filtered one at a time: every chosen layer's attention output, or every MLP's."""
FILTERS: tuple[str, ...] = ("low-pass", "high-pass")
"""low-pass(tau) removes the frequencies above tau, high-pass(tau) those below it (analysis/fourier.py)."""
_SPREAD = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500)
"""Cutoffs tried by default when a filter has more than 12 that remove something."""


def default_cutoffs(kind: str, n_numbers: int) -> list[int]:
    """The cutoffs whose filter removes something: low-pass 0..F-1, high-pass 1..F (F = N // 2, analysis/fourier.py
    max_frequency); a spread of them (those in `_SPREAD` and both ends) when there are more than 12."""
    top = n_numbers // 2
    values = list(range(top)) if kind == "low-pass" else list(range(1, top + 1))
    if len(values) <= 12:
        return values
    return sorted({values[0], values[-1], *(v for v in _SPREAD if values[0] <= v <= values[-1])})


@dataclass(frozen=True)
class FourierConfig:
    """Settings of the analyze-fourier stage; lists given for tuple fields become tuples."""

    STAGE: ClassVar[str] = "analyze-fourier"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: always: its reference prompts."""
        return True

    max_prompts: int = field(
        default=128, metadata={"help": "reference prompts of the identify run used (a stratified sample)"}
    )
    numbers: int | None = field(
        default=None,
        metadata={"help": "size N of the number index 0..N-1 (default: every single-token number, at most 1000)"},
    )
    layers: tuple[int, ...] | None = field(
        default=None, metadata={"help": "layers whose outputs are read and filtered (default all)"}
    )
    groups: tuple[str, ...] = field(default=GROUPS, metadata={"help": "groups filtered one at a time: attention, mlp"})
    filters: tuple[str, ...] = field(default=FILTERS, metadata={"help": "filters: low-pass, high-pass"})
    cutoffs: tuple[int, ...] | None = field(
        default=None,
        metadata={"help": "cutoff frequencies of every filter (default: each that removes something, at most ~12)"},
    )
    end_only: bool = field(
        default=False, metadata={"help": "filter at the last token only (default: at every position)"}
    )
    batch_size: int = field(default=16, metadata={"help": "prompts per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of the prompt sample (stratified by operation and template)"})

    def filter_plan(self, n_numbers: int) -> list[tuple[str, str, int]]:
        """(group, filter, cutoff) of every filtered run, in the order the stage runs them, over N numbers."""
        def cutoffs(kind: str) -> list[int]:
            return list(self.cutoffs) if self.cutoffs is not None else default_cutoffs(kind, n_numbers)

        return [(group, kind, cutoff) for group in self.groups for kind in self.filters for cutoff in cutoffs(kind)]

    def __post_init__(self) -> None:
        for name in ("layers", "groups", "filters", "cutoffs"):
            value = getattr(self, name)
            if isinstance(value, list | str | int):  # YAML and the CLI give lists or one value
                object.__setattr__(self, name, tuple(value) if isinstance(value, list) else (value,))
        for name in ("max_prompts", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.numbers is not None and self.numbers < 2:
            raise ConfigError(f"numbers must be at least 2, so there is a frequency above 0 (got {self.numbers})")
        for name, allowed in (("groups", GROUPS), ("filters", FILTERS)):
            value = getattr(self, name)
            if not value or len(set(value)) < len(value) or set(value) - set(allowed):
                raise ConfigError(f"{name} must be distinct names drawn from {', '.join(allowed)}; got {list(value)}")
        for name in ("layers", "cutoffs"):
            value = getattr(self, name)
            if value is not None and (not value or min(value) < 0 or len(set(value)) < len(value)):
                raise ConfigError(f"{name} must be distinct non-negative whole numbers (got {list(value)})")
