"""The finetune stage's settings (stages/finetune.py runs them), importable without torch.

The optimisation settings come from `TrainConfig` (finetune/settings.py); these add what is trained and on what
data. The CLI builds `arithmech finetune`'s options from the fields and validates them before a model loads, the
training file's rows included (`check_files`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.data.templates import OPERATIONS
from arithmech.errors import ConfigError
from arithmech.finetune.settings import HEAD_SCALES, METHODS, TARGETS, TrainConfig
from arithmech.finetune.sft_rows import ARITHMETIC, read_sft_examples, resolve_sft_data


@dataclass(frozen=True)
class FinetuneConfig(TrainConfig):
    """Settings of the finetune stage: the optimisation settings of TrainConfig plus what and on what to train."""

    STAGE: ClassVar[str] = "finetune"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: precise SFT with --from only (its top-k heads)."""
        return config.get("method", "precise") == "precise" and bool(config.get("from_run"))

    method: str = field(default="precise", metadata={"help": "precise (key heads), full (every parameter) or lora"})
    from_run: str | None = field(default=None, metadata={"help": "identify run folder: its top-k heads by effect"})
    components: tuple[str, ...] | None = field(
        default=None, metadata={"help": "heads (14.2) and MLPs (mlp.20) to train, instead of the run's top-k"}
    )
    top_k: int = field(default=32, metadata={"help": "heads taken from the identify run, most negative effect first"})
    mlps: tuple[str, ...] = field(default=(), metadata={"help": "MLP layers trained whole as well (mlp.20 or 20)"})
    top_mlps: int = field(default=0, metadata={"help": "also train the run's top MLPs by effect (paper: 3 is best)"})
    head_scale: str = field(
        default="gradient",
        metadata={"help": "H / h_l (heads per layer / selected there) on a layer's head slices: gradient (paper; "
                          "under AdamW nearly a no-op, Adam divides a constant gradient scale out), learning-rate "
                          "(their lr times H / h_l: the form that changes AdamW's steps) or none"},
    )  # fmt: skip
    data: str = field(
        default="llm_adapters_math_v1",
        metadata={"help": "llm_adapters_math_v1, gsm8k (shipped train splits), a JSONL path, or arithmetic (train "
                          "part of the template split: answer targets, plain few-shot prompts, no chat template)"},
    )
    operations: tuple[str, ...] = field(
        default=OPERATIONS, metadata={"help": "arithmetic data: the operations of its prompts (e.g. subtraction)"}
    )
    split_seed: int = field(
        default=0, metadata={"help": "arithmetic data: seed of the train/test split; evaluate with the same one"}
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "folder holding the data sets (default $ARITHMECH_DATA, then shipped)"}
    )
    target: str = field(default="rationale", metadata={"help": "rationale (correct ones only) or answer"})
    max_samples: int | None = field(
        default=None,
        metadata={"help": "use at most this many rows (seeded sample); arithmetic: this many prompts (default one per "
                          "train template and operand pair)"},
    )  # fmt: skip
    max_length: int = field(default=512, metadata={"help": "drop examples longer than this many tokens"})
    chat_template: bool = field(default=True, metadata={"help": "use the tokenizer's chat template when it has one"})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank"})
    lora_alpha: float = field(default=16.0, metadata={"help": "LoRA alpha (scale alpha / r)"})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout"})
    save_merged: bool = field(default=False, metadata={"help": "also save the whole trained model in HF format"})

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("components", "mlps", "operations"):
            value = getattr(self, name)
            if isinstance(value, list | str):
                object.__setattr__(self, name, tuple(value.split(",") if isinstance(value, str) else value))
        if self.method not in METHODS:
            raise ConfigError(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.head_scale not in HEAD_SCALES:
            raise ConfigError(f"head_scale {self.head_scale!r} is not one of {', '.join(HEAD_SCALES)}")
        if self.target not in TARGETS:
            raise ConfigError(f"target {self.target!r} is not one of {', '.join(TARGETS)}")
        if not self.operations or any(op not in OPERATIONS for op in self.operations):
            raise ConfigError(f"operations must be drawn from {', '.join(OPERATIONS)}; got {self.operations!r}")
        if self.method == "precise" and self.from_run is None and not self.components and not self.mlps:
            raise ConfigError(
                "precise SFT needs heads: give --from RUN_DIR (its top-k heads) or --components 14.2,18.5"
            )
        if self.top_mlps and self.from_run is None:
            raise ConfigError("top_mlps ranks MLPs by an identify run; give --from RUN_DIR or name them in --mlps")
        for name in ("top_k", "lora_r", "max_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.top_mlps < 0 or self.max_samples is not None and self.max_samples < 1:
            raise ConfigError("top_mlps must be 0 or more and max_samples at least 1")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout must be in [0, 1) (got {self.lora_dropout})")

    def check_files(self) -> None:
        """Read the training rows as the stage will (JSON, question and answer, a usable target), so a malformed
        file fails before a model loads; the arithmetic split is generated and has no file."""
        if self.data != ARITHMETIC:
            read_sft_examples(resolve_sft_data(self.data, self.data_dir), self.target)
