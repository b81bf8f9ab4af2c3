"""The mediate stage's settings (stages/mediate.py runs them), importable without torch.

The CLI builds `arithmech mediate`'s options from these fields and validates them before a model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from arithmech.data.mediation_prompts import (
    APPLICABLE,
    COMPONENTS,
    FORMATS,
    INTERVENTIONS,
    TASKS,
    MediationDataConfig,
)
from arithmech.errors import ConfigError


@dataclass(frozen=True)
class MediateConfig:
    """Settings of the mediate stage; lists given for tuple fields become tuples."""

    STAGE: ClassVar[str] = "mediate"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(_config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: never: it generates its own prompts."""
        return False

    tasks: tuple[str, ...] = field(
        default=("addition", "retrieval", "factual"),
        metadata={"help": f"tasks to compare, among {', '.join(TASKS)}"},
    )
    intervention: str = field(
        default="operands-and-result", metadata={"help": f"what the alternative changes: {', '.join(INTERVENTIONS)}"}
    )
    formats: tuple[str, ...] = field(default=FORMATS, metadata={"help": "prompt formats: qa, statement, equation"})
    n_pairs: int = field(default=12, metadata={"help": "prompt pairs per task"})
    few_shot: int = field(default=3, metadata={"help": "solved examples of the same template before each query"})
    layers: tuple[int, ...] | None = field(default=None, metadata={"help": "layers to intervene on (default all)"})
    components: tuple[str, ...] = field(default=COMPONENTS, metadata={"help": "components: mlp, attn"})
    neuron_layer: int | None = field(
        default=None,
        metadata={"help": "MLP layer of the neuron analysis (default: largest last-token MLP median IE on the "
                  "first arithmetic task)"},
    )  # fmt: skip
    neuron_k: int = field(default=20, metadata={"help": "top-k neurons compared between tasks (0: no neurons)"})
    seed: int = field(default=0, metadata={"help": "seed of the pair generation"})
    max_rows: int = field(default=256, metadata={"help": "interventions per forward pass"})

    def __post_init__(self) -> None:
        for name in ("tasks", "formats", "components", "layers"):
            value = getattr(self, name)
            if isinstance(value, list | str):  # YAML and the CLI give lists or one name; keep the config hashable
                object.__setattr__(self, name, tuple([value] if isinstance(value, str) else value))
        for name, allowed in (("tasks", TASKS), ("formats", FORMATS), ("components", COMPONENTS)):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not value or len(set(value)) < len(value) or set(value) - set(allowed):
                raise ConfigError(f"{name} must be distinct names drawn from {', '.join(allowed)}; got {value!r}")
        if self.intervention not in INTERVENTIONS:
            raise ConfigError(f"intervention must be one of {', '.join(INTERVENTIONS)}; got {self.intervention!r}")
        misfits = [t for t in self.tasks if self.intervention not in APPLICABLE[t]]
        if misfits:
            raise ConfigError(
                f"intervention {self.intervention} does not apply to {', '.join(misfits)}; drop those tasks or use "
                "operands-and-result"
            )
        for name, low in (("n_pairs", 1), ("few_shot", 0), ("neuron_k", 0), ("max_rows", 1), ("seed", None)):
            value = getattr(self, name)
            if not _is_int(value) or (low is not None and value < low):
                raise ConfigError(f"{name} must be an integer{f' >= {low}' if low is not None else ''}; got {value!r}")
        layers = self.layers
        valid = layers is None or (all(_is_int(x) and x >= 0 for x in layers) and 0 < len(set(layers)) == len(layers))
        if not valid:
            raise ConfigError(f"layers must be distinct layer indices >= 0, or null for all; got {self.layers!r}")
        if self.neuron_layer is not None and not (_is_int(self.neuron_layer) and self.neuron_layer >= 0):
            raise ConfigError(f"neuron_layer must be a layer index >= 0, or null to choose; got {self.neuron_layer!r}")
        if self.neuron_layer is None and self.neuron_k and "mlp" not in self.components:
            raise ConfigError("give neuron_layer (or neuron_k 0) when components exclude mlp: it is chosen from MLP IE")

    def data(self, task: str) -> MediationDataConfig:
        """The generation settings of one task: up to n_pairs per template, so rejections can be replaced."""
        return MediationDataConfig(
            tasks=(task,),
            formats=self.formats,
            interventions=(self.intervention,),
            n_per_template=self.n_pairs,
            few_shot=self.few_shot,
            seed=self.seed,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
