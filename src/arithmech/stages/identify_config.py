"""The identify stage's settings (stages/identify.py runs them), importable without torch.

The CLI builds `arithmech identify`'s config from its options and validates it before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.errors import ConfigError
from arithmech.patching.variants import VARIANTS

METHODS: tuple[str, ...] = ("exact", "attribution", "both")


@dataclass(frozen=True)
class IdentifyConfig(ReferenceSetConfig):
    """Settings of the identify stage: the reference set's (`data/reference_config.py`), then the scan's; every
    field is also a CLI option."""

    STAGE: ClassVar[str] = "identify"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: never: it makes one."""
        return False

    variant: str = field(default="path", metadata={"help": "path, direct or total"})
    method: str = field(
        default="exact", metadata={"help": "exact (path patching), attribution (first-order estimate) or both"}
    )
    threshold: float = field(default=-0.05, metadata={"help": "key if effect < threshold"})
    fraction_threshold: float | None = field(
        default=None, metadata={"help": "key if effect >= this fraction of the whole-prompt effect"}
    )
    top_k: int = field(default=10, metadata={"help": "components listed as top-k"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.method not in METHODS:
            raise ConfigError(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.variant not in VARIANTS:
            raise ConfigError(f"variant {self.variant!r} is not one of {', '.join(VARIANTS)}")
        if self.top_k < 1:
            raise ConfigError(f"top_k must be at least 1 (got {self.top_k})")
        if not self.threshold < 0:  # a key component lowers the answer's logit: its effect is negative
            meant = abs(self.threshold) / (100 if abs(self.threshold) >= 1 else 1) or 0.05  # 5 meant as 5%
            raise ConfigError(
                f"threshold {self.threshold:g} is not negative, so components that raise the answer's logit would "
                f"be key; give a negative fraction of the logit (-0.05 is -5%), e.g. --threshold -{meant:g}"
            )
        if self.fraction_threshold is not None and not self.fraction_threshold > 0:
            raise ConfigError(
                f"fraction_threshold {self.fraction_threshold:g} is not positive, so every component that lowers the "
                "answer's logit would be key; give a share of the whole-prompt effect, e.g. --fraction-threshold "
                f"{abs(self.fraction_threshold) or 0.1:g}"
            )
