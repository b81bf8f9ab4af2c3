"""The settings of `analyze attention` (stages/analyze_attention.py runs them), importable without torch.

The CLI builds the config from its options and validates it before a model loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.analysis.head_labels import DEFAULT_TAU
from arithmech.errors import ConfigError

_HEAD_NAME = re.compile(r"^\s*[0-9]+\.[0-9]+\s*$")


@dataclass(frozen=True)
class AttentionConfig:
    """Settings of `analyze attention`; every field is also a CLI option."""

    STAGE: ClassVar[str] = "analyze_attention"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: always: its key heads and reference prompts."""
        return True

    heads: tuple[str, ...] | None = field(
        default=None,
        metadata={"help": "heads to analyse as L.H (e.g. 14.2,18.5); default: the identify run's key heads"},
    )
    top_k: int = field(default=10, metadata={"help": "heads taken by effect when the identify run has no key heads"})
    tau: float = field(
        default=DEFAULT_TAU,
        metadata={"help": "share of END's attention a role needs for an operand/operator label (0-1]"},
    )
    max_prompts: int = field(
        default=64, metadata={"help": "reference prompts averaged over (a stratified sample of the run's)"}
    )
    n_examples: int = field(default=3, metadata={"help": "single prompts drawn in attention_examples.png"})
    batch_size: int = field(default=16, metadata={"help": "prompts per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of the prompt sample (stratified by operation and template)"})

    def __post_init__(self) -> None:
        heads = self.heads
        if isinstance(heads, str):
            heads = tuple(p for p in heads.split(",") if p.strip())
        if heads is not None:
            heads = tuple(h.strip() for h in heads)
            if not heads:
                raise ConfigError("heads is empty; list heads as L.H (14.2,18.5), or leave it unset")
            for name in heads:
                if not _HEAD_NAME.match(name):
                    raise ConfigError(
                        f"{name!r} is not an attention head; write heads as L.H (14.2) - MLPs have no pattern"
                    )
            object.__setattr__(self, "heads", heads)
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"tau must be in (0, 1], a share of END's attention (got {self.tau})")
        for name in ("top_k", "max_prompts", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.n_examples < 0:
            raise ConfigError(f"n_examples must be 0 or more (got {self.n_examples})")
