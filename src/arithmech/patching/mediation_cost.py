"""The cost of causal mediation (`mediation.py`), without torch: the engine's row blocks and the planner's work.

Per pair of n tokens whose base and alternative first differ at position f (`mediation.mediation_effects`):
    base run       one pass of [base; alternative]: 2 n token-layers, 2 rows unembedded at END
    interventions  for each position p in f..n-1, the sites (component, layer) sorted by layer, `max_rows` a
                   block (`intervention_blocks`); each block one `run_from_layers` call on positions p..n-1
                   (`models/from_layer_cost.joined_token_layers`: every row from its site's layer, a stand-in row
                   below the block's first), and every row's END unembedded
Neurons (`mediation.neuron_effects`) at one layer: the base run again, then (if the prompts differ at all) the
neurons `max_rows` a block, each a one-position step from that layer.
Checked against the engine's counted work in tests/unit/plan/test_work_counted.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from arithmech.models.from_layer_cost import joined_token_layers


def intervention_blocks(site_layers: Sequence[int], max_rows: int) -> list[list[int]]:
    """Site indices of each intervened pass at one position: the sites sorted by layer, `max_rows` at a time."""
    order = sorted(range(len(site_layers)), key=lambda s: site_layers[s])  # rows join the pass by layer
    return [order[start : start + max_rows] for start in range(0, len(order), max_rows)]


def mediation_cost(
    n_layers: int, site_layers: Sequence[int], pairs: Sequence[tuple[int, int]], max_rows: int
) -> tuple[int, int]:
    """(token-layers, rows unembedded) of `mediation_effects` on pairs of (tokens, first differing position)."""
    blocks = [[site_layers[s] for s in block] for block in intervention_blocks(site_layers, max_rows)]
    token_layers = rows = 0
    for n, first in pairs:
        token_layers += 2 * n * n_layers
        rows += 2
        for p in range(first, n):
            token_layers += sum(joined_token_layers(n_layers, block, n - p) for block in blocks)
            rows += len(site_layers)
    return token_layers, rows


def neuron_cost(
    n_layers: int, layer: int, neurons: int, pairs: Sequence[tuple[int, int]], max_rows: int
) -> tuple[int, int]:
    """(token-layers, rows unembedded) of `neuron_effects` on `neurons` neurons of `layer`."""
    blocks = [min(max_rows, neurons - start) for start in range(0, neurons, max_rows)]
    per_pair = sum(joined_token_layers(n_layers, [layer] * block, 1) for block in blocks)  # the same for every pair
    token_layers = rows = 0
    for n, first in pairs:
        token_layers += 2 * n * n_layers
        rows += 2
        if first < n:
            token_layers += per_pair
            rows += neurons
    return token_layers, rows
