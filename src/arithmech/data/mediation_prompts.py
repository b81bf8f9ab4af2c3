"""The unit of mediation data (Stolfo et al. 2023): a base prompt, its alternative, and both results.

A pair is a base prompt with result r and an alternative prompt of the same template with result r'. The
mediation engine (`patching/mediation.py`) runs the base prompt with one component's activation taken from
the alternative and reads how much probability moves from r to r'. Which part of the prompt differs is the
intervention type:

    operands-and-result   other operands, other result           "3 + 5 = " (8)  vs  "2 + 4 = " (6)
    operands-same-result  other operands, the same result        "3 + 5 = " (8)  vs  "6 + 2 = " (8)
    operator              same operands, other operation         "3 + 5 = " (8)  vs  "3 * 5 = " (15)

Tasks: the four operations in three formats (Q/A, statement, equation; `mediation_templates.json`), and two
comparison tasks that test whether a component is specific to arithmetic: number retrieval ("Paul has 3
apples and 5 pears. How many pears does Paul have?"; the alternative changes the number asked for, or for
operands-same-result the other number) and factual knowledge (`facts.json`; the alternative asks about
another subject of the same relation with a different answer; the subject plays operand 1). Not every type
fits every task (`APPLICABLE`): retrieval has no operator, facts only the subject swap.

Every pair carries the character spans of operand 1 and operand 2 (in text order) in both prompts, so token
positions can be classed after tokenization (`mediation_tokens.py`). Facts have no operand 2.

This module holds the vocabulary (tasks, formats, intervention types), the pair, the generation config and
the two data files; `mediation_generate.py` builds pairs from them and `mediation_tokens.py` tokenizes them.

Usage:
    >>> from arithmech.data.mediation_generate import generate_mediation_pairs
    >>> cfg = MediationDataConfig(tasks=("addition", "retrieval"), interventions=("operands-and-result",))
    >>> pairs = generate_mediation_pairs(cfg)
    >>> MediationPair.from_dict(pairs[0].to_dict()) == pairs[0]  # round-trips through JSON
    True
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from arithmech.data.templates import OPERATIONS
from arithmech.errors import ConfigError, DataError

TASKS: tuple[str, ...] = (*OPERATIONS, "retrieval", "factual")
FORMATS: tuple[str, ...] = ("qa", "statement", "equation")
INTERVENTIONS: tuple[str, ...] = ("operands-and-result", "operands-same-result", "operator")
COMPONENTS: tuple[str, ...] = ("mlp", "attn")
"""What a mediation run intervenes on in each layer: the MLP's or the attention's output (patching/mediation.py)."""
APPLICABLE = {
    **{op: INTERVENTIONS for op in OPERATIONS},
    "retrieval": ("operands-and-result", "operands-same-result"),
    "factual": ("operands-and-result",),
}
Spans = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class MediationPair:
    """A base prompt and its alternative, with both results and the operand spans (characters, [start, end))."""

    base: str
    alternative: str
    base_result: str
    alt_result: str
    task: str
    intervention: str
    format: str
    template_id: str
    spans: Spans = field(default_factory=dict)
    """"operand1", "operand2" (absent for facts) and "operator" (arithmetic) in `base`."""
    alt_spans: Spans = field(default_factory=dict)
    """The same spans in `alternative`."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Operands, the alternative's operation and the like, for reading results back."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MediationPair:
        spans = {k: (int(v[0]), int(v[1])) for k, v in data.get("spans", {}).items()}
        alt_spans = {k: (int(v[0]), int(v[1])) for k, v in data.get("alt_spans", {}).items()}
        return cls(**{**data, "spans": spans, "alt_spans": alt_spans})


@dataclass(frozen=True)
class MediationDataConfig:
    """Which mediation pairs to generate; lists given for tuple fields become tuples."""

    tasks: tuple[str, ...] = field(default=("addition",), metadata={"help": f"tasks among {', '.join(TASKS)}"})
    formats: tuple[str, ...] = field(default=FORMATS, metadata={"help": "prompt formats: qa, statement, equation"})
    interventions: tuple[str, ...] = field(
        default=("operands-and-result",), metadata={"help": f"intervention types among {', '.join(INTERVENTIONS)}"}
    )
    n_per_template: int = field(default=8, metadata={"help": "pairs per template (or fact relation) and type"})
    operand_min: int = field(default=0, metadata={"help": "smallest operand / retrieved number (>= 0)"})
    operand_max: int = field(default=9, metadata={"help": "largest operand / retrieved number"})
    result_max: int | None = field(default=9, metadata={"help": "largest arithmetic result (None: no cap)"})
    few_shot: int = field(default=3, metadata={"help": "solved examples of the same template before the query"})
    seed: int = field(default=0, metadata={"help": "seed of the local random generators"})

    def __post_init__(self) -> None:
        for name, allowed in (("tasks", TASKS), ("formats", FORMATS), ("interventions", INTERVENTIONS)):
            value = getattr(self, name)
            if isinstance(value, list):  # YAML gives lists; keep the config hashable
                value = tuple(value)
                object.__setattr__(self, name, value)
            if not isinstance(value, tuple) or not value or any(v not in allowed for v in value):
                raise ConfigError(f"{name} must be a non-empty list drawn from {', '.join(allowed)}; got {value!r}")
        for name in ("n_per_template", "operand_min", "operand_max", "few_shot", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or (name != "seed" and value < 0):
                raise ConfigError(f"{name} must be a non-negative integer; got {value!r}")
        if self.n_per_template < 1 or self.operand_max < self.operand_min:
            raise ConfigError("set n_per_template >= 1 and operand_max >= operand_min")
        if self.result_max is not None and (not isinstance(self.result_max, int) or self.result_max < 0):
            raise ConfigError(f"result_max must be a non-negative integer or null; got {self.result_max!r}")


# -- data files -------------------------------------------------------------------------------------------
def _read_json(path: str | Path | None, name: str) -> dict[str, Any]:
    try:
        text = (
            Path(path).read_text(encoding="utf-8-sig")
            if path
            else resources.files("arithmech.data").joinpath(name).read_text(encoding="utf-8")
        )
        return json.loads(text)
    except (OSError, ValueError) as err:  # ValueError: not JSON, or not UTF-8
        raise DataError(f"cannot read mediation data {path or name}: {err}; check the file") from None


def load_mediation_templates(path: str | Path | None = None) -> dict[str, Any]:
    """The arithmetic and retrieval templates, names and item pairs (`mediation_templates.json`)."""
    data = _read_json(path, "mediation_templates.json")
    for t in data.get("arithmetic", []):
        if t.get("format") not in FORMATS or set(t.get("operators", {})) - set(OPERATIONS):
            raise DataError(f"arithmetic template {t.get('id')!r} needs a format and operators by operation")
    return data


def load_facts(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Fact relations: {"id", "templates": {format: text with {S}}, "facts": [[subject, answer], ...]}."""
    relations = _read_json(path, "facts.json").get("relations", [])
    for rel in relations:
        answers = {a for _, a in rel.get("facts", [])}
        if len(answers) < 2 or any("{S}" not in t for t in rel.get("templates", {}).values()):
            raise DataError(f"fact relation {rel.get('id')!r} needs {{S}} templates and two different answers")
    return relations
