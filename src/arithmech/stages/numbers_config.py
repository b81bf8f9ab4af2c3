"""The analyze-numbers stage's settings (stages/numbers.py runs them), importable without torch.

The CLI builds `arithmech analyze numbers`'s options from these fields and validates them before a model
loads; what needs the model or the tokenizer (layers that exist, a range the tokenizer gives as the stage needs,
a PCA dimension against the values seen, enough correct prompts) is checked by the stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.data.templates import FORMATIONS, OPERATIONS
from arithmech.errors import ConfigError

CLOCK = "clock"
"""The site name of the Clock (helix(a, b, a+b) at the last token; `stages/numbers_clock.py`)."""
PERIOD_CHOICES: tuple[int, ...] = (2, 5, 10, 100)
"""Kantamneni & Tegmark's periods; the helices run over subsets of them."""


@dataclass(frozen=True)
class NumbersConfig:
    """Settings of the analyze-numbers stage; lists given for tuple fields become tuples."""

    STAGE: ClassVar[str] = "analyze-numbers"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: only to classify its heads (identify_run)."""
        return config.get("identify_run") is not None

    operation: str = field(default="addition", metadata={"help": "operation of the prompts"})
    formation: str = field(default="equation", metadata={"help": "formation of the one template (its first)"})
    low: int | None = field(
        default=None,
        metadata={"help": "smallest operand (default 0 with single-token numbers, 10 on a digit-splitting tokenizer)"},
    )
    high: int | None = field(
        default=None,
        metadata={"help": "operands run over low..high-1 (default: 100, or fewer where fewer are single tokens)"},
    )
    max_pairs: int = field(default=512, metadata={"help": "most operand pairs in the grid (a seeded sample above)"})
    max_prompts: int = field(
        default=48, metadata={"help": "correct prompts (with their corrupted partners) patched per site"}
    )
    few_shot: int = field(default=3, metadata={"help": "solved examples before each query (the same for all)"})
    layers: tuple[int, ...] | None = field(
        default=None, metadata={"help": "layers whose input residual is read and patched (default all)"}
    )
    sites: tuple[str, ...] | None = field(
        default=None,
        metadata={"help": "sites read, e.g. a, b, last or a.units, and clock (helix(a, b, a+b) at the last token) "
                  "(default all)"},
    )
    identify_run: str | None = field(
        default=None,
        metadata={"help": "identify run whose key heads the Clock classifies as a,b or a+b heads (c_ab, c_a+b); "
                  "needs the clock site"},
    )
    head_top_k: int = field(
        default=10, metadata={"help": "heads classified when the identify run names no key heads: its top by effect"}
    )
    families: tuple[str, ...] | None = field(
        default=None,
        metadata={"help": "families fitted, by kind (helix, circle, linear, ...) or name (helix-5-10) (default all)"},
    )
    periods: tuple[int, ...] | None = field(
        default=None,
        metadata={"help": "periods of the circles and helices, of 2, 5, 10, 100 (default: each the range can show)"},
    )
    pca_dim: int | None = field(
        default=None,
        metadata={"help": "PCA dimension the fits work in (default: the train values less one, K&T's 100 of 100)"},
    )
    shuffles: int = field(default=3, metadata={"help": "seeded permutations of the shuffled-order control"})
    min_effect: float = field(
        default=0.1,
        metadata={"help": "a restored share is estimated only where the whole-layer patch moves LD by at least this "
                  "share of the clean-vs-corrupted difference (RMS over pairs); else the cell is left empty with a "
                  "reason"},
    )
    heldout: float = field(default=0.2, metadata={"help": "share of the operand values held out of every fit"})
    filter_correct: bool = field(default=True, metadata={"help": "keep only prompts the model answers correctly"})
    batch_size: int = field(default=16, metadata={"help": "prompts per forward pass"})
    max_rows: int = field(default=256, metadata={"help": "patched rows per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of the grid, partners, held-out values and controls"})

    def __post_init__(self) -> None:
        for name in ("layers", "sites", "families", "periods"):
            value = getattr(self, name)
            if isinstance(value, list | str | int) and not isinstance(value, bool):
                object.__setattr__(self, name, tuple(value) if isinstance(value, list) else (value,))
        if self.operation not in ("addition", "subtraction"):
            raise ConfigError(f"operation must be addition or subtraction (got {self.operation!r})")
        if self.operation not in OPERATIONS or self.formation not in FORMATIONS:
            raise ConfigError(f"formation {self.formation!r} is not one of {', '.join(FORMATIONS)}")
        if self.identify_run is not None and self.sites is not None and CLOCK not in self.sites:
            raise ConfigError(f"identify_run classifies heads at the Clock's site; add {CLOCK} to sites")
        for name in ("max_pairs", "max_prompts", "batch_size", "max_rows", "shuffles", "head_top_k"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.few_shot < 0:
            raise ConfigError(f"few_shot must be 0 or more (got {self.few_shot})")
        if self.low is not None and self.low < 0:
            raise ConfigError(f"low must be 0 or more (got {self.low})")
        if self.high is not None and self.high < (self.low or 0) + 2:
            raise ConfigError(
                f"high must leave at least 2 operand values from low (got low {self.low}, high {self.high})"
            )
        if self.periods is not None and (
            not self.periods or set(self.periods) - set(PERIOD_CHOICES) or len(set(self.periods)) < len(self.periods)
        ):
            raise ConfigError(f"periods must be distinct values of 2, 5, 10, 100 (got {list(self.periods)})")
        if self.high is not None:
            check_periods(self.periods, self.low or 0, self.high)
        if self.pca_dim is not None and self.pca_dim < 1:
            raise ConfigError(f"pca_dim must be at least 1 (got {self.pca_dim})")
        if not 0 <= self.min_effect < 1:
            raise ConfigError(f"min_effect is a share in [0, 1) (got {self.min_effect})")
        if not 0 <= self.heldout < 1:
            raise ConfigError(f"heldout is a share in [0, 1) (got {self.heldout})")
        if self.layers is not None and (
            not self.layers or min(self.layers) < 0 or len(set(self.layers)) < len(self.layers)
        ):
            raise ConfigError(f"layers must be distinct non-negative layer numbers (got {list(self.layers)})")


def check_periods(periods: tuple[int, ...] | None, low: int, high: int) -> None:
    """ConfigError for a period longer than the range low..high-1 (it cannot show one whole period)."""
    long = [t for t in periods or () if t > high - low]
    if long:
        raise ConfigError(
            f"period {long[0]} is longer than the {high - low} operand values {low}..{high - 1}, which cannot show "
            f"one whole period; leave it out or widen the range to at least {long[0]} values"
        )
