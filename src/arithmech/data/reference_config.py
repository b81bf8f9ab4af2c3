"""Which prompts make a reference set (`data/reference_set.py` builds it), importable without torch.

identify's options of the same names set these fields, and the CLI checks them before a model loads: the
values, and (`check_files`) the content of a prompt or templates file, read as the stage reads it. Only the
checks that need the tokenizer (an answer of one token, a counterfactual of the same length) wait for the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arithmech.data.generate import GenerationConfig, generate_pairs
from arithmech.data.io import read_prompt_file
from arithmech.data.prompts import PromptPair
from arithmech.data.templates import FORMATIONS, load_templates
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
    answer_digits: bool = field(
        default=False,
        metadata={"help": "score answers of several tokens token by token, each on the answer's earlier tokens"},
    )
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
            single_digit_answer=not self.answer_digits,
        )

    def check_files(self) -> None:
        """Read the prompt or templates file (and generate from it) as the stage will: a malformed file is one
        DataError naming its lines, before a model loads."""
        reference_pairs(self)


def reference_pairs(cfg: ReferenceSetConfig) -> list[PromptPair]:
    """Step 1 of a reference set: the user's prompt file, or the pairs generated from the templates (a templates
    file, or the shipped ones). Every rule that needs no tokenizer is checked here (`data/pair_checks.py`)."""
    if cfg.prompts_file:
        return read_prompt_file(cfg.prompts_file)
    templates = load_templates(cfg.templates_file) if cfg.templates_file else None
    return generate_pairs(cfg.generation(), templates)
