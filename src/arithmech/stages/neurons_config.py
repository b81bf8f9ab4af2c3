"""The neurons stage's settings (stages/neurons.py runs them), importable without torch.

The CLI builds `arithmech neurons`'s options from these fields and validates them before a model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.templates import OPERATIONS
from arithmech.errors import ConfigError, DataError

PRUNE_SCORES: tuple[str, ...] = ("cna", "li")

LORA_BATCH = 16
"""Most prompts of a LoRA training step (stages/neurons.py trains on min(LORA_BATCH, prompts))."""

@dataclass(frozen=True)
class NeuronsConfig:
    """Settings of the neurons stage."""

    STAGE: ClassVar[str] = "neurons"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: never: it generates its own prompts."""
        return False

    operations: tuple[str, ...] = field(default=OPERATIONS, metadata={"help": "operations with a prompt set each"})
    formations: tuple[str, ...] = field(default=("equation",), metadata={"help": "prompt formations"})
    few_shot: int = field(default=3, metadata={"help": "solved examples before each query"})
    max_prompts: int = field(default=8, metadata={"help": "answered prompts per operation"})
    filter_correct: bool = field(default=True, metadata={"help": "keep only prompts the model answers"})
    importance_layers: tuple[int, ...] | None = field(
        default=None, metadata={"help": "layers whose heads are zeroed one by one (default all)"}
    )
    top_heads: int = field(default=5, metadata={"help": "heads per operation in the specialisation table"})
    head: str | None = field(
        default=None, metadata={"help": "head zeroed for CNA, e.g. 14.2 (default: most important on the first op)"}
    )
    layers: tuple[int, ...] | None = field(
        default=None, metadata={"help": "deep layers scored and pruned (default: the last third)"}
    )
    top_neurons: int = field(default=20, metadata={"help": "top CNA neurons reported"})
    n_tokens: int = field(default=10, metadata={"help": "value-vector tokens listed per neuron"})
    keep_sizes: tuple[int, ...] = field(default=(10, 100, 1000), metadata={"help": "neurons kept when pruning"})
    prune_by: str = field(default="cna", metadata={"help": "cna or li (the intact LI) as the pruning score"})
    selection: str = field(default="global", metadata={"help": "global or per-layer ranking when pruning"})
    n_random: int = field(default=3, metadata={"help": "random pruning repeats per size"})
    lora: bool = field(default=True, metadata={"help": "run the LoRA coefficient analysis"})
    adapter: str | None = field(default=None, metadata={"help": "your peft LoRA folder (else one is trained)"})
    lora_layer: int | None = field(
        default=None, metadata={"help": "layer whose MLP gets the LoRA (default: holds most top neurons)"}
    )
    lora_steps: int = field(default=20, metadata={"help": "LoRA training steps"})
    lora_rank: int = field(default=4, metadata={"help": "LoRA rank"})
    batch_size: int = field(default=32, metadata={"help": "rows per forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of the prompts, random pruning and LoRA"})

    def __post_init__(self) -> None:
        for name in ("operations", "formations", "importance_layers", "layers", "keep_sizes"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        bad = [op for op in self.operations if op not in OPERATIONS]
        if bad or not self.operations:
            raise ConfigError(f"operations must be drawn from {', '.join(OPERATIONS)}; got {list(self.operations)}")
        if self.prune_by not in PRUNE_SCORES:
            raise ConfigError(f"prune_by {self.prune_by!r} is not one of {', '.join(PRUNE_SCORES)}")
        if self.selection not in ("global", "per-layer"):
            raise ConfigError(f"selection {self.selection!r} is not global or per-layer")
        for name in ("max_prompts", "top_heads", "top_neurons", "n_tokens", "lora_steps", "lora_rank", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.n_random < 0 or self.few_shot < 0 or not self.keep_sizes or min(self.keep_sizes) < 0:
            raise ConfigError("n_random and few_shot must be 0 or more, and keep_sizes non-negative numbers")

    def reference_settings(self, operation: str | None = None) -> ReferenceSetConfig:
        """The settings its prompt sets are generated and filtered with, as identify's reference set is: one set
        per operation (`operation`), else all of them."""
        operations = self.operations if operation is None else (operation,)
        return ReferenceSetConfig(operations=operations, formations=self.formations, few_shot=self.few_shot,
                                  max_prompts=self.max_prompts, filter_correct=self.filter_correct, seed=self.seed)

    def check_files(self) -> None:
        """A given --adapter folder holds a LoRA adapter peft can read: its adapter_config.json is a JSON object of
        peft_type LORA naming its target modules, beside its weights; DataError before a model loads."""
        if self.adapter is not None:
            check_adapter_folder(Path(self.adapter))


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
"""The files peft saves an adapter's weights in (safetensors, or the older pickle)."""


def check_adapter_folder(folder: Path) -> None:
    """The content check of `NeuronsConfig.check_files` (the folder and its adapter_config.json exist)."""
    path = folder / "adapter_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(
            f"{str(path)!r} is not readable JSON ({err}); pass a folder saved by peft's save_pretrained"
        ) from None
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else type(config).__name__
        raise DataError(f"{str(path)!r} is no LoRA adapter (peft_type {kind!r}); the neurons stage reads LoRA adapters")
    if not config.get("target_modules"):
        raise DataError(f"{str(path)!r} names no target_modules; pass a complete peft LoRA adapter folder")
    if not any((folder / name).is_file() for name in ADAPTER_WEIGHTS):
        raise DataError(
            f"{str(folder)!r} has no adapter weights ({' or '.join(ADAPTER_WEIGHTS)}); pass the whole folder "
            "peft's save_pretrained wrote"
        )

