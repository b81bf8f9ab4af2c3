"""The knockout stage's settings (stages/knockout.py runs them), importable without torch.

The CLI builds `arithmech knockout`'s config from its options and validates it before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.errors import ConfigError
from arithmech.knockout.modes import ABLATION_MODES, MIN_GROUP_SIZE

DEFAULT_MAX_K = 16
"""The largest k of a ranking read from an identify run, unless max_k says otherwise."""


@dataclass(frozen=True)
class KnockoutConfig:
    """Settings of the knockout stage."""

    STAGE: ClassVar[str] = "knockout"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: with --from only (its ranking and prompts)."""
        return bool(config.get("from_run"))

    from_run: str | None = field(default=None, metadata={"help": "identify run folder (ranking and prompts)"})
    components: tuple[str, ...] | None = field(
        default=None, metadata={"help": "ranked components to knock out instead of the run's ranking"}
    )
    ablation: str = field(default="mean", metadata={"help": "mean, zero or resample"})
    end_only: bool = field(default=False, metadata={"help": "ablate at the last token only"})
    max_k: int | None = field(
        default=None,
        metadata={"help": f"largest number of components knocked out together (default {DEFAULT_MAX_K}, or all "
                  "the components given)"},
    )
    n_random: int = field(default=5, metadata={"help": "random-rank seeds per k"})
    include_mlps: bool = field(default=False, metadata={"help": "rank and draw MLPs too, not only heads"})
    max_prompts: int = field(
        default=64, metadata={"help": "prompts scored per prompt set (a sample stratified by operation and template)"}
    )
    held_out: bool = field(
        default=True,
        metadata={"help": "with --from: also knock out on held-out prompts (the run's templates, facts its ranking "
                  "never saw), reported first"},
    )
    min_group_size: int = field(
        default=MIN_GROUP_SIZE,
        metadata={"help": "smallest template group averaged (mean) or drawn from (resample); smaller: END mean"},
    )
    answer_digits: bool = field(
        default=False,
        metadata={"help": "score answers of several tokens token by token (on for an identify run made with it)"},
    )
    batch_size: int = field(default=64, metadata={"help": "rows (configuration x prompt) per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of the random-rank draws"})

    @property
    def largest_k(self) -> int:
        """The largest k: max_k when set, else all the --components given, or DEFAULT_MAX_K of a run's ranking."""
        if self.max_k is not None:
            return self.max_k
        return len(self.components) if self.components else DEFAULT_MAX_K

    def __post_init__(self) -> None:
        if isinstance(self.components, list):
            object.__setattr__(self, "components", tuple(self.components))
        if self.ablation not in ABLATION_MODES:
            raise ConfigError(f"ablation {self.ablation!r} is not one of {', '.join(ABLATION_MODES)}")
        if self.from_run is None and not self.components:
            raise ConfigError("nothing to knock out: give --from RUN_DIR (an identify run) or --components 14.2,18.5")
        if self.min_group_size < 2:
            raise ConfigError(f"min_group_size must be at least 2 (got {self.min_group_size})")
        for name in ("max_k", "max_prompts", "batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.n_random < 0:
            raise ConfigError(f"n_random must be 0 or more (got {self.n_random})")
