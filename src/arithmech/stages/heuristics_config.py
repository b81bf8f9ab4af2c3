"""The heuristics stage's settings (stages/heuristics.py runs them), importable without torch.

The CLI builds `arithmech analyze heuristics`'s options from these fields and validates them before a model
loads; what needs the model (the grid against the tokenizer's single-token numbers, the layers against the
model's depth) is checked by the stage before any scan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.data.templates import FORMATIONS, OPERATIONS
from arithmech.errors import ConfigError

ABLATIONS: tuple[str, ...] = ("mean", "zero")



def default_ks(width: int, max_fraction: float = 0.05) -> tuple[int, ...]:
    """k per layer: 1, 2, 5, 10, 20, ... up to max_fraction of the layer's neurons, and round(1%) of them."""
    cap = max(1, int(max_fraction * width))
    one_percent = max(1, round(0.01 * width))
    ladder = [k for base in (1, 10, 100, 1000) for k in (base, 2 * base, 5 * base) if k <= cap]
    return tuple(sorted({*ladder, min(one_percent, width)}))


@dataclass(frozen=True)
class HeuristicsConfig:
    """Settings of the heuristics stage; lists given for tuple fields become tuples."""

    STAGE: ClassVar[str] = "heuristics"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: never: it generates its own prompts."""
        return False

    operations: tuple[str, ...] = field(default=OPERATIONS, metadata={"help": "operations, one operand grid each"})
    formation: str = field(
        default="equation", metadata={"help": "formation of the one template per operation (its first)"}
    )
    grid_size: int | None = field(
        default=None,
        metadata={"help": "operands run over 0..grid_size-1 (default: every single-token number)"},
    )
    max_pairs: int = field(
        default=512, metadata={"help": "most operand pairs per operation (a seeded sample above it)"}
    )
    few_shot: int = field(default=3, metadata={"help": "solved examples before each query (the same for all)"})
    filter_correct: bool = field(default=True, metadata={"help": "keep only the pairs the model answers"})
    layers: tuple[int, ...] | None = field(
        default=None, metadata={"help": "MLP layers scanned (default: the second half of the model)"}
    )
    threshold: float = field(default=0.6, metadata={"help": "match score that classifies a neuron"})
    top_neurons: int = field(
        default=6, metadata={"help": "strongest neurons (mean |direct effect|) drawn per operation"}
    )
    ks: tuple[int, ...] | None = field(
        default=None,
        metadata={"help": "neurons ablated per layer (default 1, 2, 5, ... up to 5% of a layer, and 1%)"},
    )
    n_random: int = field(default=3, metadata={"help": "random-neuron draws (seeds) per k"})
    ablations: tuple[str, ...] = field(default=ABLATIONS, metadata={"help": "ablation sources: mean, zero"})
    batch_size: int = field(default=32, metadata={"help": "prompts (or ablation rows) per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of the grid sample, few-shot examples and random draws"})

    def sweep_configurations(self, ks: tuple[int, ...]) -> int:
        """Configurations of the ablation sweep (neurons/heuristic_scan.ablation_sweep): nothing ablated, then per
        ablation and k the top neurons and n_random random draws; each is one END row per prompt."""
        return 1 + len(self.ablations) * len(ks) * (1 + self.n_random)

    def __post_init__(self) -> None:
        for name in ("operations", "layers", "ks", "ablations"):
            value = getattr(self, name)
            if isinstance(value, list | str | int) and not isinstance(value, bool):
                object.__setattr__(self, name, tuple(value) if isinstance(value, list) else (value,))
        bad = [op for op in self.operations if op not in OPERATIONS]
        if bad or not self.operations or len(set(self.operations)) < len(self.operations):
            raise ConfigError(
                f"operations must be distinct names from {', '.join(OPERATIONS)}; got {list(self.operations)}"
            )
        if self.formation not in FORMATIONS:
            raise ConfigError(f"formation {self.formation!r} is not one of {', '.join(FORMATIONS)}")
        if not self.ablations or set(self.ablations) - set(ABLATIONS):
            raise ConfigError(f"ablations must be drawn from {', '.join(ABLATIONS)}; got {list(self.ablations)}")
        if self.grid_size is not None and self.grid_size < 2:
            raise ConfigError(f"grid_size must be at least 2 numbers per operand (got {self.grid_size})")
        for name in ("max_pairs", "top_neurons", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.few_shot < 0 or self.n_random < 0:
            raise ConfigError("few_shot and n_random must be 0 or more")
        if not 0 < self.threshold <= 1:
            raise ConfigError(f"threshold is a match score in (0, 1]; got {self.threshold}")
        if self.layers is not None and (
            not self.layers or min(self.layers) < 0 or len(set(self.layers)) < len(self.layers)
        ):
            raise ConfigError(f"layers must be distinct non-negative layer numbers (got {list(self.layers)})")
        if self.ks is not None and (not self.ks or min(self.ks) < 1):
            raise ConfigError(f"ks must be neuron counts of at least 1 (got {list(self.ks)})")
