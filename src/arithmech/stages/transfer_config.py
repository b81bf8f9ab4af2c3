"""The transfer stage's settings (stages/transfer.py runs them), importable without torch.

The CLI builds `arithmech transfer`'s config from its options and validates it, target set names included
(`data/target_sets.py`), before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.data.target_sets import TargetOptions, target_set
from arithmech.errors import ConfigError
from arithmech.knockout.modes import ABLATION_MODES, MIN_GROUP_SIZE

DEFAULT_TARGETS: tuple[str, ...] = (
    "addition", "subtraction", "multiplication", "division", "addition-qa", "multidigit-addition",
    "decimals-addition", "svamp", "gsm8k",
)  # fmt: skip


@dataclass(frozen=True)
class TransferConfig:
    """Settings of the transfer stage; every field is also a CLI option."""

    STAGE: ClassVar[str] = "transfer"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: always: the components of every source."""
        return True

    sources: tuple[str, ...] = field(default=(), metadata={"help": "identify run folders (components)"})
    targets: tuple[str, ...] = field(default=DEFAULT_TARGETS, metadata={"help": "target sets to knock out on"})
    k: int | None = field(
        default=None, metadata={"help": "components knocked out (default: the source's key heads, 1-32)"}
    )
    include_mlps: bool = field(default=False, metadata={"help": "rank and draw MLPs too, not only heads"})
    ablation: str = field(default="mean", metadata={"help": "mean, zero or resample"})
    end_only: bool = field(default=False, metadata={"help": "ablate at the last token only"})
    n_random: int = field(default=5, metadata={"help": "random-rank control seeds"})
    max_prompts: int = field(
        default=32, metadata={"help": "kept prompts scored per target (a sample stratified by template)"}
    )
    min_group_size: int = field(
        default=MIN_GROUP_SIZE,
        metadata={"help": "smallest template group averaged (mean) or drawn from (resample); smaller: END mean"},
    )
    limit: int = field(default=200, metadata={"help": "word-problem rows considered per target"})
    n_per_template: int = field(default=8, metadata={"help": "prompt pairs per template (generated sets)"})
    few_shot: int = field(default=3, metadata={"help": "solved examples before each query"})
    filter_correct: bool = field(default=True, metadata={"help": "keep only prompts the model answers"})
    data_dir: str | None = field(
        default=None, metadata={"help": "folder holding svamp/ and gsm8k/ (default $ARITHMECH_DATA, then shipped)"}
    )
    batch_size: int = field(default=32, metadata={"help": "rows (configuration x prompt) per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of generation, sampling and random draws"})

    def __post_init__(self) -> None:
        for name in ("sources", "targets"):
            value = getattr(self, name)
            if isinstance(value, list | str):
                object.__setattr__(self, name, tuple([value] if isinstance(value, str) else value))
            value = getattr(self, name)
            if not value:
                raise ConfigError(f"no {name} given; list at least one (--{name} a,b)")
            repeated = sorted({v for v in value if value.count(v) > 1})
            if repeated:
                raise ConfigError(f"{name} {', '.join(repeated)} given twice; list each once")
        for name in self.targets:
            target_set(name)
        if self.ablation not in ABLATION_MODES:
            raise ConfigError(f"ablation {self.ablation!r} is not one of {', '.join(ABLATION_MODES)}")
        if self.min_group_size < 2:
            raise ConfigError(f"min_group_size must be at least 2 (got {self.min_group_size})")
        for name in ("max_prompts", "limit", "n_per_template", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.k is not None and self.k < 1:
            raise ConfigError(f"k must be at least 1 (got {self.k})")
        if self.n_random < 0 or self.few_shot < 0:
            raise ConfigError("n_random and few_shot must be 0 or more")

    def target_options(self) -> TargetOptions:
        return TargetOptions(self.n_per_template, self.few_shot, self.limit, self.seed, self.data_dir)
