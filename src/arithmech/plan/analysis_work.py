"""The work of the analysis stages that read an identify run's prompts: agreement, attention, mlp, fourier, heuristics.

Each function counts what the stage's engine runs, in token-layers (one decoder layer on one position of one row),
MLP rows (one MLP on one row, outside a decoder layer) and rows read out through the whole vocabulary, from the
engines' own cost functions where they have one; tests/unit/plan/test_work_counted.py holds each against the
work the engine really does on a tiny model, given the engine's real prompt lengths.

agreement (stages/agreement.py), per method on max_prompts prompts:
    path, attribution  the scans' cost models (plan/work.py), with the identify run's variant (planned: path)
    zero-ablation end  one reference run of every prompt at once, keeping its cache (collect_end_states), then
                       `total_patched_logits` twice, senders each component and each whole attention layer
                       (scan_cost.patched_end_cost): a decoding step per sender, one MLP per head sender and per
                       attention layer, every row read out through the whole vocabulary (the answer's
                       probability), and the intact END read out once per prompt
    zero-ablation all  `knockout_scores` of nothing, each component and each attention layer zeroed
                       (knockout/configurations.knockout_cost; zero values need no run)
    mediation          the counterfactual's END logits of every prompt, then `mediation_effects` on the pairs
                       whose answer moves (planned: all) at their default max_rows (patching/mediation_cost.py)
attention (analysis/attention.end_attention): per chunk of batch_size prompts a forward pass cut after the last
    layer of the chosen heads (planned: the last layer, as a ranking read from the run is not known here).
mlp (stages/analyze_mlp.py): per chunk one forward pass for the END states (collect_end_states), no readout but
    the example prompt's: every layer's MLP update and the final residual through the whole vocabulary.
fourier (stages/fourier.py): per chunk one forward pass for the END states, then `filtered_predictions` once
    unfiltered and once per (group, filter, cutoff): a forward pass per chunk read out at END.
heuristics (neurons/heuristic_scan.py), per operation on the grid's prompts: `scan_neurons` (a forward pass per
    chunk, END read out), then `ablation_sweep`: the shared few-shot prefix once, per pass each prompt's tokens
    between the prefix and END, and one END token per (configuration, prompt) row, read out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arithmech.knockout.configurations import KnockoutCost, knockout_cost
from arithmech.patching.mediation_cost import mediation_cost
from arithmech.patching.scan_cost import patched_end_cost

MEDIATION_MAX_ROWS = 256
"""mediation_effects' default max_rows, which agreement's mediation uses."""


@dataclass(frozen=True)
class Cost:
    """Token-layers, MLP rows outside a layer, and rows read out through the whole vocabulary."""

    token_layers: int = 0
    mlp_rows: int = 0
    readout_rows: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.token_layers + other.token_layers, self.mlp_rows + other.mlp_rows,
                    self.readout_rows + other.readout_rows)  # fmt: skip


def _chunks(widths: Sequence[int], batch_size: int) -> list[Sequence[int]]:
    return [widths[lo : lo + batch_size] for lo in range(0, len(widths), batch_size)]


def chunked_passes(n_layers: int, widths: Sequence[int], batch_size: int, read: bool = True) -> Cost:
    """A forward pass per chunk of `batch_size` prompts, each padded to its widest (END + 1), END read out."""
    chunks = _chunks(widths, batch_size)
    token_layers = sum(len(c) * max(c) for c in chunks) * n_layers
    return Cost(token_layers, 0, len(widths) if read else 0)


def zero_end_cost(n_layers: int, n_heads: int, widths: Sequence[int]) -> Cost:
    """agreement's END-only zero ablation (`_zero_ablation(end_only=True)`) of prompts of `widths` tokens."""
    n = len(widths)
    ends = [w - 1 for w in widths]
    components = [layer + 1 for layer in range(n_layers) for _ in range(n_heads + 1)]
    rows_c = patched_end_cost(n_layers, components, ends)
    rows_l = patched_end_cost(n_layers, list(range(1, n_layers + 1)), ends)
    reference = n * max(widths) * n_layers
    return Cost(reference + rows_c[0] + rows_l[0], n * n_layers * (n_heads + 1), rows_c[1] + rows_l[1] + n)


def zero_all_cost(n_layers: int, n_heads: int, widths: Sequence[int], batch_size: int) -> KnockoutCost:
    """agreement's zero ablation at every position: knockout_scores of nothing, each component (heads, then the
    MLP, layer by layer) and each whole attention layer."""
    first = [n_layers] + [layer for layer in range(n_layers) for _ in range(n_heads + 1)] + list(range(n_layers))
    return knockout_cost(n_layers, first, widths, batch_size)


def mediation_end_cost(n_layers: int, widths: Sequence[int], pairs: Sequence[tuple[int, int]]) -> Cost:
    """agreement's mediation: the counterfactual run of every prompt of `widths` tokens at once (END read out),
    then `mediation_effects` of both components at every layer on the `pairs` of (tokens, first differing
    position) whose answer the counterfactual moves."""
    sites = [layer for _ in ("mlp", "attn") for layer in range(n_layers)]
    token_layers, rows = mediation_cost(n_layers, sites, pairs, MEDIATION_MAX_ROWS)
    return Cost(len(widths) * max(widths) * n_layers + token_layers, 0, len(widths) + rows)


def attention_cost(last_layer: int, widths: Sequence[int], batch_size: int) -> Cost:
    """analyze attention: per chunk a pass through layers 0..last_layer (the hooked layer's input included)."""
    return chunked_passes(last_layer + 1, widths, batch_size, read=False)


def mlp_lens_cost(n_layers: int, widths: Sequence[int], batch_size: int) -> Cost:
    """analyze mlp: a pass per chunk for the END states, and the example prompt's L + 1 full readouts."""
    return chunked_passes(n_layers, widths, batch_size, read=False) + Cost(0, 0, n_layers + 1)


def fourier_cost(n_layers: int, widths: Sequence[int], batch_size: int, filters: int) -> Cost:
    """analyze fourier: the spectra's pass per chunk, then the unfiltered and each filter's predictions."""
    passes = chunked_passes(n_layers, widths, batch_size)
    return chunked_passes(n_layers, widths, batch_size, read=False) + Cost(
        (1 + filters) * passes.token_layers, 0, (1 + filters) * passes.readout_rows
    )


def heuristics_cost(n_layers: int, widths: Sequence[int], prefix: int, configurations: int, batch_size: int) -> Cost:
    """heuristics on one operation's grid prompts of `widths` tokens sharing `prefix` tokens: scan_neurons'
    passes, then ablation_sweep's prefix, between-prefix-and-END tokens and one END row per (configuration,
    prompt), prompts grouped by length, max(1, batch_size // configurations) a pass."""
    scan = chunked_passes(n_layers, widths, batch_size)
    per_pass = max(1, batch_size // configurations)
    groups: dict[int, int] = {}
    for w in widths:
        groups[w] = groups.get(w, 0) + 1
    token_layers = prefix * n_layers
    for w, size in groups.items():
        for lo in range(0, size, per_pass):
            prompts = min(per_pass, size - lo)
            token_layers += prompts * (w - 1 - prefix) * n_layers + prompts * configurations * n_layers
    return scan + Cost(token_layers, 0, len(widths) * configurations)
