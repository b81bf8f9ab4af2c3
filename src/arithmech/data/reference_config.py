"""Which prompts make a reference set (`data/reference_set.py` builds it), importable without torch.

identify's options of the same names set these fields, and the CLI checks them before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arithmech.data.generate import GenerationConfig
from arithmech.data.templates import FORMATIONS
from arithmech.errors import ConfigError


@dataclass(frozen=True)
class ReferenceSetConfig:
    """Which prompts make the reference set; identify's options of the same names set them."""

    operations: tuple[str, ...] = field(default=("addition",), metadata={"help": "operations to generate"})
    formations: tuple[str, ...] = field(default=FORMATIONS, metadata={"help": "formations to generate"})
    n_per_template: int = field(default=16, metadata={"help": "prompt pairs generated per template"})
    few_shot: int = field(default=3, metadata={"help": "solved examples before each query"})
    operand_min: int = field(default=0, metadata={"help": "smallest operand"})
    operand_max: int = field(default=9, metadata={"help": "largest operand"})
    prompts_file: str | None = field(default=None, metadata={"help": "JSONL of your own prompt pairs"})
    templates_file: str | None = field(default=None, metadata={"help": "JSON of your own templates"})
    max_prompts: int = field(
        default=64, metadata={"help": "reference prompts kept (a sample stratified by operation and template)"}
    )
    filter_correct: bool = field(default=True, metadata={"help": "keep only prompts the model answers"})
    batch_size: int = field(default=16, metadata={"help": "prompts per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of generation and sampling"})

    def __post_init__(self) -> None:
        for name in ("operations", "formations"):
            value = getattr(self, name)
            if isinstance(value, list | str):
                object.__setattr__(self, name, tuple([value] if isinstance(value, str) else value))
        for name in ("max_prompts", "batch_size", "n_per_template"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")

    def generation(self) -> GenerationConfig:
        return GenerationConfig(
            operations=self.operations,
            formations=self.formations,
            n_per_template=self.n_per_template,
            operand_min=self.operand_min,
            operand_max=self.operand_max,
            few_shot=self.few_shot,
            seed=self.seed,
        )
