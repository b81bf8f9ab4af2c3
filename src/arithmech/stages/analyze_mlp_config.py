"""The analyze-mlp stage's settings (stages/analyze_mlp.py runs them), importable without torch.

The CLI builds `arithmech analyze mlp`'s config from its options and validates it before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.errors import ConfigError


@dataclass(frozen=True)
class AnalyzeMlpConfig:
    """Settings of the analyze-mlp stage; every field is also a CLI option."""

    STAGE: ClassVar[str] = "analyze-mlp"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: always: its reference prompts."""
        return True

    max_prompts: int = field(
        default=256,
        metadata={"help": "reference prompts of the identify run to average over (a stratified sample)"},
    )
    example_prompt: int = field(
        default=0,
        metadata={"help": "index, among the prompts used, of the prompt whose ranks are shown (6c)"},
    )
    batch_size: int = field(default=16, metadata={"help": "prompts per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of the prompt sample (stratified by operation and template)"})
    layers: tuple[int, ...] | None = field(
        default=None, metadata={"help": "layers to report and plot, in order (default: all)"}
    )
    max_number: int | None = field(
        default=None,
        metadata={"help": "candidate numbers are 0..max_number (default: largest operand/answer, at least 9)"},
    )

    def __post_init__(self) -> None:
        if isinstance(self.layers, int):
            object.__setattr__(self, "layers", (self.layers,))
        elif isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        for name in ("max_prompts", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if not 0 <= self.example_prompt < self.max_prompts:
            raise ConfigError(
                f"example_prompt {self.example_prompt} is not among the {self.max_prompts} prompts used "
                f"(max_prompts); choose 0..{self.max_prompts - 1}"
            )
        if self.max_number is not None and self.max_number < 1:
            raise ConfigError(f"max_number must be at least 1, so there is a wrong candidate (got {self.max_number})")
        if self.layers is not None:
            if not self.layers or any(layer < 0 for layer in self.layers) or len(set(self.layers)) < len(self.layers):
                raise ConfigError(f"layers must be distinct non-negative layer numbers (got {list(self.layers)})")
