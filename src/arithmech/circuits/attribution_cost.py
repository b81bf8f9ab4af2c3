"""The cost of EAP / EAP-IG (`attribution.py`, `gradients.py`) and of the faithfulness sweep (`faithfulness.py`),
without torch: the engines' interpolation points and runs, and the planner's work.

Units: token-layers (one decoder layer on one position of one row) and multiply-accumulates of linear layers.
Chunks are (prompts n, width W, shared first positions s) of `CircuitBatch.chunks`.

EAP / EAP-IG, per chunk, with m interpolation points (EAP: 1; `interpolation_points`):
    plain       the counterfactual sender outputs: n W token-layers (`senders.collect_sender_outputs`)
                + per point the shared positions as a cache, one row: s (`replicas.shared_start`)
    gradient    per point one forward of n (W - s) token-layers whose attention runs on g = H / K replicas of
                the batch (`replicas.py`): c_mlp + g c_attn a token-layer; its backward (input gradients only,
                the weights frozen) as much again
    assembly    per point and gradient token-layer the 3H head-input gradients: 3 H d_head d_model
    contraction per chunk, every receiver's gradient against the senders its layer reads (`attribution.contract`):
                n (W - s) d_model x sum over layers of (3 H + 1)(1 + (l + 1)(H + 1)) + (1 + L (H + 1))
Faithfulness sweep (`faithfulness.circuit_metrics`), per chunk: the counterfactual sender outputs and the clean
run (n W each; mean ablation first one run of every prompt for the means), then the distinct circuits,
`circuits_per_pass` a patched pass, each circuit x prompt row over W - s positions (s = 0 under mean ablation).
The rows' deviating head inputs (norms and per-head projections for receivers whose input a circuit swaps) depend
on the circuit's edges and are not planned; `sweep_runs` is the engine's own count of circuits run.
Checked against the engines on a tiny model in tests/unit/plan/test_work_counted.py.
"""

from __future__ import annotations

from collections.abc import Sequence

SWEEP_CIRCUITS_PER_PASS = 4
"""Circuits of one patched pass of the sweep: `faithfulness.circuit_metrics`' and `faithfulness_sweep`'s default."""
Chunk = tuple[int, int, int]
"""(prompts, width, shared first positions) of one chunk of prompts."""


def interpolation_points(method: str, steps: int) -> list[float]:
    """The alphas of the gradient runs: EAP the clean run only, EAP-IG k / m for k = 1..m."""
    return [1.0] if method == "eap" else [k / steps for k in range(1, steps + 1)]


def edge_attribution_token_layers(n_layers: int, chunks: Sequence[Chunk], points: int) -> tuple[int, int]:
    """(plain token-layers, gradient runs' forward token-layers) of `edge_scores` (module docstring)."""
    plain = sum(n * width + points * shared for n, width, shared in chunks) * n_layers
    gradient = sum(points * n * (width - shared) for n, width, shared in chunks) * n_layers
    return plain, gradient


def contraction_rows(n_layers: int, n_heads: int) -> int:
    """Receiver x sender products per position and d_model of `attribution.contract` (module docstring)."""
    per_layer = sum((3 * n_heads + 1) * (1 + (layer + 1) * (n_heads + 1)) for layer in range(n_layers))
    return per_layer + 1 + n_layers * (n_heads + 1)


def sweep_circuits(percents: Sequence[float]) -> int:
    """Distinct circuits of one ranking's sweep at most: each size below 100 %, by signed and by absolute score
    (`faithfulness.faithfulness_sweep`; equal ones run once, 100 % is the clean run)."""
    return 2 * sum(1 for p in percents if p < 100)


def sweep_runs(n_chunks: int, distinct: int, mean_ablation: bool) -> int:
    """Circuits run by `circuit_metrics` (its progress total): per chunk the full and empty circuits and the
    distinct others (under mean ablation the empty circuit is one of them)."""
    return n_chunks * (2 + distinct - mean_ablation)


def sweep_token_layers(
    n_layers: int, chunks: Sequence[Chunk], distinct: int, circuits_per_pass: int, mean_ablation: bool
) -> int:
    """Token-layers of `circuit_metrics`' plain runs and circuit rows (module docstring), deviating inputs aside."""
    total = 0
    for n, width, shared in chunks:
        s = 0 if mean_ablation else shared
        calls = -(-distinct // circuits_per_pass)
        total += 2 * n * width + distinct * n * (width - s) + calls * s + (n * width if mean_ablation else 0)
    return total * n_layers
