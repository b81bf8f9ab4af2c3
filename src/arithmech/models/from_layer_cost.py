"""The work of rows that join a forward pass at a later layer (`from_layer.py`), without torch.

`run_from_layers` runs each decoder layer on the rows that have joined by then, every row over all the call's
positions; below the first row's layer one stand-in row keeps the layer's shapes valid. Rows joining at
n_layers (the final norm) run no layer. In token-layers (one layer on one position of one row):

    sum over layers l < L of  max(1, #{rows with layer <= l}) x positions

A stage's cost model multiplies token-layers by c_layer (scan_cost.layer_macs) and adds the unembedding of the
rows it reads; the planner (plan/work.py) and the engines' tests (tests/unit/plan/test_work_counted.py) use it.
"""

from __future__ import annotations

from collections.abc import Sequence


def joined_token_layers(n_layers: int, row_layers: Sequence[int], positions: int) -> int:
    """Token-layers of one `run_from_layers` call: rows joining at `row_layers`, each over `positions`."""
    joined = [0] * (n_layers + 1)
    for layer in row_layers:
        joined[min(layer, n_layers)] += 1
    total, so_far = 0, 0
    for layer in range(n_layers):
        so_far += joined[layer]
        total += max(1, so_far)
    return total * positions
