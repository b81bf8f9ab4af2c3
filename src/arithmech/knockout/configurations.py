"""The knockout sweep's configurations and their cost, without torch: the engine and `arithmech plan` share them.

Configurations (Zhang et al. 2024, Figure 3; `sweep.knockout_sweep`)
    nothing knocked out, then for each k of 1, 2, 4, ... up to max_k (`k_values`) the effect-ranked top k and
    `n_random` random draws with as many heads and MLPs as the top k (`draw_like`, seeded by (seed, k, draw)).
    The functions are generic over the component type: the engine passes `models.sites.Component`s, the
    planner (layer, is_head) pairs in the same order (`layer_pool`), so both see the same draws.

Cost (`batched.knockout_scores`), in token-layers and unembedded rows, per chunk of max(1, batch_size //
configurations) prompts padded to the chunk's width W:
    intact     one plain run of the chunk: prompts x W x L (the residuals rows join from)
    rows       (configuration, prompt) rows sorted by the configuration's lowest ablated layer, batch_size a call,
               each call `from_layer_cost.joined_token_layers` over W positions (nothing ablated: layer L)
    readout    every row's END through the unembedding (d_vocab x d_model)
Mean and resample ablation values come on top: one plain run of every prompt of the set (`ablation.py`).
Checked against the engine's counted work in tests/unit/plan/test_work_counted.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from arithmech.errors import ConfigError
from arithmech.models.from_layer_cost import joined_token_layers

C = TypeVar("C")


def k_values(max_k: int) -> list[int]:
    """1, 2, 4, ... below max_k, then max_k."""
    ks, k = [], 1
    while k < max_k:
        ks.append(k)
        k *= 2
    return [*ks, max_k]


def draw_like(chosen: Sequence[C], pool: Sequence[C], seed: str, is_head: Callable[[C], bool]) -> list[C]:
    """A random control for `chosen`: as many heads and as many MLPs as it holds, drawn from those of `pool`
    (a seeded `random.Random(seed)`; heads only draw as `sample(pool, k)` did from a pool of heads)."""
    rng = random.Random(seed)
    n_mlps = sum(not is_head(c) for c in chosen)
    heads, mlps = [c for c in pool if is_head(c)], [c for c in pool if not is_head(c)]
    if len(chosen) - n_mlps > len(heads) or n_mlps > len(mlps):
        raise ConfigError(f"{len(chosen) - n_mlps} heads and {n_mlps} MLPs are more than the {len(heads)} heads and "
                          f"{len(mlps)} MLPs to draw from; choose fewer components")  # fmt: skip
    drawn = rng.sample(heads, len(chosen) - n_mlps) if n_mlps < len(chosen) else []
    return drawn + (rng.sample(mlps, n_mlps) if n_mlps else [])


def sweep_configurations(
    ranked: Sequence[C], pool: Sequence[C], max_k: int, n_random: int, seed: int, is_head: Callable[[C], bool]
) -> list[tuple[tuple[int, str, int | None], list[C]]]:
    """((k, ranking, draw), components) of every configuration of the sweep, in the order it scores them."""
    out: list[tuple[tuple[int, str, int | None], list[C]]] = [((0, "none", None), [])]
    for k in k_values(max_k):
        out.append(((k, "effect", None), list(ranked[:k])))
        out += [((k, "random", s), draw_like(ranked[:k], pool, f"{seed}-{k}-{s}", is_head)) for s in range(n_random)]
    return out


def layer_pool(n_layers: int, n_heads: int, mlps: bool) -> list[tuple[int, bool]]:
    """The planner's stand-in for `models.sites.all_components`: (layer, is_head) in sender order."""
    return [(layer, head) for layer in range(n_layers) for head in [True] * n_heads + ([False] if mlps else [])]


@dataclass(frozen=True)
class KnockoutCost:
    """The work of `knockout_scores`: plain token-layers, the rows' token-layers and rows read at END."""

    intact_token_layers: int
    row_token_layers: int
    end_rows: int


def knockout_cost(n_layers: int, first_layers: Sequence[int], widths: Sequence[int], batch_size: int) -> KnockoutCost:
    """The cost of `knockout_scores` (module docstring): configurations whose lowest ablated layers are
    `first_layers` (n_layers: none), on prompts of `widths` tokens (END + 1), rows `batch_size` a call."""
    per_chunk = max(1, batch_size // len(first_layers))
    order = sorted(first_layers)  # rows join by layer: each prompt's rows follow its configuration's layer
    intact = rows = end_rows = 0
    for lo in range(0, len(widths), per_chunk):
        chunk = widths[lo : lo + per_chunk]
        width = max(chunk)
        intact += len(chunk) * width * n_layers
        layers = [layer for layer in order for _ in chunk]
        for start in range(0, len(layers), batch_size):
            block = layers[start : start + batch_size]
            rows += joined_token_layers(n_layers, block, width)
            end_rows += len(block)
    return KnockoutCost(intact, rows, end_rows)
