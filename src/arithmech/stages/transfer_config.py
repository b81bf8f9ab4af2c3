"""The transfer stage's settings (stages/transfer.py runs them), importable without torch.

The CLI builds `arithmech transfer`'s config from its options and validates it, target set names included
(`data/target_sets.py`), before a model loads.

Cost of one target (`target_cost`, for `arithmech plan`; checked against the stage's counted work in
tests/unit/plan/test_work_counted.py), in token-layers and rows read through the unembedding:
    filter     every candidate prompt run once (`predict_at_end`, rows_per_pass(W) a call, each call padded
               to its own widest prompt), its END read: the reference filtering of stages/transfer_targets.py
    values     mean and resample ablation: every candidate's counterfactual (mean) or reference (resample)
               run once at the set's width W (`knockout/ablation.py` run_activations); zero: none
    knockout   the scored prompts' configurations (`knockout/configurations.knockout_cost`), rows_per_pass
               of the scored batch's width a call
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.data.target_sets import TargetOptions, target_set
from arithmech.errors import ConfigError
from arithmech.knockout.configurations import KnockoutCost, knockout_cost
from arithmech.knockout.modes import ABLATION_MODES, MIN_GROUP_SIZE

K_CAP = 32
"""The most components a source knocks out by default (its key components, at least 1)."""
TOKEN_BUDGET = 4096
"""Tokens per forward pass (rows x width): the logits of long word-problem prompts are large."""


def rows_per_pass(width: int, batch_size: int) -> int:
    """Rows per forward pass: `batch_size`, fewer for long prompts (TOKEN_BUDGET)."""
    return max(1, min(batch_size, TOKEN_BUDGET // max(width, 1)))


@dataclass(frozen=True)
class TargetCost:
    """The work of one target (module docstring): plain token-layers and END rows, and the knockout's."""

    plain_token_layers: int
    plain_rows: int
    knockout: KnockoutCost


def target_cost(
    n_layers: int,
    first_layers: Sequence[int],
    candidate_widths: Sequence[int],
    scored_widths: Sequence[int],
    batch_size: int,
    values: bool,
) -> TargetCost:
    """One target's cost (module docstring): `candidate_widths` (END + 1) of every candidate row, `scored_widths`
    of the rows kept, configurations whose lowest ablated layers are `first_layers`; `values`: mean or resample."""
    width = max(candidate_widths)
    size = rows_per_pass(width, batch_size)
    chunks = [candidate_widths[lo : lo + size] for lo in range(0, len(candidate_widths), size)]
    plain = sum(len(c) * max(c) for c in chunks) * n_layers
    if values:
        plain += len(candidate_widths) * width * n_layers
    cost = knockout_cost(n_layers, first_layers, scored_widths, rows_per_pass(max(scored_widths), batch_size))
    return TargetCost(plain, len(candidate_widths), cost)


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
