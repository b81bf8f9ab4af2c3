"""The method-agreement stage's settings (stages/agreement.py runs them), importable without torch.

The CLI builds `arithmech analyze agreement`'s config from its options and validates it before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.errors import ConfigError

METHODS: tuple[str, ...] = ("path", "attribution", "zero-ablation", "mediation")


@dataclass(frozen=True)
class AgreementConfig:
    """Settings of the method-agreement stage."""

    STAGE: ClassVar[str] = "agreement"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: always: its reference prompts and patching variant."""
        return True

    from_run: str = field(metadata={"help": "identify run folder: its reference prompts and patching variant"})
    methods: tuple[str, ...] = field(default=METHODS, metadata={"help": "methods compared (at least two)"})
    max_prompts: int = field(
        default=16, metadata={"help": "reference prompts used by every method (a stratified sample of the run's)"}
    )
    ks: tuple[int, ...] = field(default=(5, 10, 20), metadata={"help": "top-k sizes of the overlap columns"})
    batch_size: int = field(default=16, metadata={"help": "rows per forward pass"})
    zero_positions: str = field(default="end", metadata={"help": "zero-ablation at the last token (end) or all"})
    seed: int = field(default=0, metadata={"help": "seed of the prompt sample (stratified by operation and template)"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(self.methods))
        object.__setattr__(self, "ks", tuple(self.ks))
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
        if len(set(self.methods)) < 2:
            raise ConfigError(f"agreement needs at least two different methods; got {list(self.methods)}")
        if self.max_prompts < 2 or self.batch_size < 1:
            raise ConfigError("max_prompts must be at least 2 and batch_size at least 1")
        if self.zero_positions not in ("end", "all"):
            raise ConfigError(f"zero_positions must be end or all; got {self.zero_positions!r}")
        if not self.ks or min(self.ks) < 1:
            raise ConfigError(f"ks must be positive whole numbers, e.g. 5,10; got {list(self.ks)}")
