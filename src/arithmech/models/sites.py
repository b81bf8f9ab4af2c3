"""Component names: a head prints as "L.H" (paper style, "14.2") and an MLP as "mlp.L"."""

from __future__ import annotations

import re
from dataclasses import dataclass

from arithmech.errors import ConfigError
from arithmech.models.view import Dims

_HEAD = re.compile(r"^([0-9]+)\.([0-9]+)$")
_MLP = re.compile(r"^(?:mlp\.([0-9]+)|L?([0-9]+)\.mlp)$")


@dataclass(frozen=True, order=True)
class Component:
    """An attention head (head is set) or the MLP of a layer (head is None)."""

    layer: int
    head: int | None = None

    @property
    def kind(self) -> str:
        return "mlp" if self.head is None else "head"

    @property
    def name(self) -> str:
        return f"mlp.{self.layer}" if self.head is None else f"{self.layer}.{self.head}"

    def __str__(self) -> str:
        return self.name


def all_components(dims: Dims) -> list[Component]:
    """Every head and MLP in sender order: layer 0 heads 0..H-1, mlp.0, layer 1 heads, mlp.1, ..."""
    out: list[Component] = []
    for layer in range(dims.n_layers):
        out.extend(Component(layer, head) for head in range(dims.n_heads))
        out.append(Component(layer))
    return out


def parse_component(text: str, dims: Dims) -> Component:
    """Parse "14.2" or "mlp.20" and check that the component exists in a model of size `dims`."""
    text = text.strip()
    head_match, mlp_match = _HEAD.match(text), _MLP.match(text)
    if head_match:
        component = Component(int(head_match.group(1)), int(head_match.group(2)))
    elif mlp_match:
        component = Component(int(mlp_match.group(1) or mlp_match.group(2)))
    else:
        raise ConfigError(
            f"component {text!r} is not a name arithmech knows; write heads as L.H (14.2) and MLPs as mlp.L"
        )
    if not 0 <= component.layer < dims.n_layers:
        raise ConfigError(
            f"component {text!r} does not exist: the model has layers 0..{dims.n_layers - 1}"
        )
    if component.head is not None and not 0 <= component.head < dims.n_heads:
        raise ConfigError(
            f"component {text!r} does not exist: each layer has heads 0..{dims.n_heads - 1}"
        )
    return component


def parse_components(text: str, dims: Dims) -> list[Component]:
    """Parse a comma-separated list such as "14.2,18.5,mlp.20"."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError("no components given; list them as 14.2,18.5,mlp.20")
    return [parse_component(p, dims) for p in parts]
