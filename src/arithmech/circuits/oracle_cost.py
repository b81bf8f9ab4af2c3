"""The oracle's cost model (`oracle.py`, module docstring) and its grouping of edges into passes, without torch.

`oracle.predicted_passes` applies it to a tokenized batch and a graph; `arithmech plan` (plan/work.py) to the
shapes of a model it never loads. Work is in decoder-layer passes of the batch: every layer on every position of
every prompt.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_groups(edges: Sequence[tuple[int, int]], circuits_per_pass: int) -> list[list[int]]:
    """Indices of the edges of each patched pass: a receiver's edges, at most `circuits_per_pass` at once."""
    by_receiver: dict[int, list[int]] = {}
    for i, (receiver, _) in enumerate(edges):
        by_receiver.setdefault(receiver, []).append(i)
    step = circuits_per_pass
    return [ids[j : j + step] for ids in by_receiver.values() for j in range(0, len(ids), step)]


def oracle_passes(
    n_layers: int, width: int, chunks: Sequence[tuple[int, int, int]], groups: Sequence[tuple[int, int]]
) -> float:
    """The oracle's work in passes of the whole batch (`width` its padded width); `chunks` are (prompts, width,
    first differing position) of the engine's chunks, `groups` (circuits, receiver layer) of its passes (the
    logits' receiver at n_layers)."""
    n = n_layers
    prompts = sum(size for size, _, _ in chunks)
    total = 0.0
    for size, t, p0 in chunks:
        tail = (t - p0) / t  # share of the positions a pass runs
        work = 3 + tail / n + (n - 1) / n * tail / size  # 3 plain runs; m(clean) from the last layer
        for circuits, receiver_layer in groups:
            layer = min(receiver_layer, n - 1)
            work += circuits * (n - layer) / n * tail + layer / n * tail / size  # rows; the stand-in row
        total += work * size * t / (prompts * width)
    return total
