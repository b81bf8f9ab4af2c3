"""The finetune settings, and the names they are checked against, without torch.

`TrainConfig` holds the optimisation settings every method shares (Zhang et al. 2024, sec. 5.3: lr 2e-5, batch
128, 2 epochs, warm-up ratio 0.02, weight decay 0.1); the finetune stage's config extends it. They live apart
from the training loop (train.py) so that the CLI can build `arithmech finetune`'s options from these fields and
reject a bad value before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arithmech.errors import ConfigError

METHODS: tuple[str, ...] = ("precise", "full", "lora")
"""What is trained: the key heads' slices (finetune/methods.py), every parameter, or LoRA adapters."""
SCHEDULES: tuple[str, ...] = ("linear", "cosine")
"""Learning-rate decay after the warm-up (finetune/optim.py `build_scheduler`)."""
HEAD_SCALES: tuple[str, ...] = ("gradient", "learning-rate", "none")
"""How H / h_l acts on a layer's head slices: on their gradient (paper), on their learning rate, or not at all."""
TARGETS: tuple[str, ...] = ("rationale", "answer")
"""What the loss is taken on: the worked solution or the final answer only (finetune/data.py)."""


LR_RANGE = (1e-7, 1e-3)
"""Learning rates outside this range are warned about: the paper trains at 2e-5, rates above 1e-3 (50x that)
usually make AdamW fine-tuning of a pretrained model diverge, and below 1e-7 it barely moves the weights."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings shared by every method (paper defaults)."""

    lr: float = field(default=2e-5, metadata={"help": "peak learning rate"})
    batch_size: int = field(default=128, metadata={"help": "examples per optimizer step, over all processes"})
    micro_batch_size: int = field(
        default=8, metadata={"help": "examples per forward pass and process (gradient accumulation makes up the rest)"}
    )
    epochs: int = field(default=2, metadata={"help": "passes over the training data"})
    max_steps: int | None = field(default=None, metadata={"help": "optimizer steps in all, instead of epochs"})
    warmup_ratio: float = field(default=0.02, metadata={"help": "share of the steps with linear warm-up from 0"})
    lr_schedule: str = field(default="linear", metadata={"help": "decay after warm-up: linear or cosine (to 0)"})
    weight_decay: float = field(default=0.1, metadata={"help": "decoupled AdamW weight decay of matrices"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm (0 = none)"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2"})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    seed: int = field(default=0, metadata={"help": "seed of the data order, sampling and dropout"})
    checkpoint_every: int = field(default=100, metadata={"help": "optimizer steps between checkpoints (0 = none)"})
    resume: bool = field(default=False, metadata={"help": "continue from the newest checkpoint in the output folder"})
    stop_after: int | None = field(
        default=None, metadata={"help": "end this invocation after this many steps, with a checkpoint (use --resume)"}
    )

    def lr_warning(self) -> str | None:
        """Why `lr` is out of the usual range (LR_RANGE), or None."""
        low, high = LR_RANGE
        if self.lr > high:
            return (f"--lr {self.lr:g} is above {high:g} (the paper trains at 2e-5), where fine-tuning a pretrained "
                    "model with AdamW usually diverges; try 1e-5 to 1e-4")  # fmt: skip
        if self.lr < low:
            return f"--lr {self.lr:g} is below {low:g}: training will barely change the weights; try 1e-5 to 1e-4"
        return None

    def __post_init__(self) -> None:
        for name in ("batch_size", "micro_batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        for name in ("max_steps", "stop_after"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1 when given (got {value})")
        if self.lr <= 0:
            raise ConfigError(f"lr must be positive (got {self.lr})")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"warmup_ratio must be in [0, 1) (got {self.warmup_ratio})")
        if self.lr_schedule not in SCHEDULES:
            raise ConfigError(f"lr_schedule {self.lr_schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.weight_decay < 0 or self.max_grad_norm < 0 or self.checkpoint_every < 0:
            raise ConfigError("weight_decay, max_grad_norm and checkpoint_every must not be negative")
        if self.batch_size % self.micro_batch_size:
            raise ConfigError(
                f"batch_size {self.batch_size} is not a multiple of micro_batch_size {self.micro_batch_size}; "
                "pick sizes that divide"
            )

