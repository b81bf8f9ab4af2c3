"""The cost model of the path-patching scans (`path.py`, `total.py`), in multiply-accumulates, without torch.

Background
    A scan runs, per chunk of prompts (`path.length_chunks`), one reference pass of n prompts padded to the chunk's
    width W and one counterfactual pass of the positions after the chunk's shared start s; then the sweep over
    senders at END. The unit of work is a multiply-accumulate of a linear layer (tests/forward_cost.py):
    attention scores, norms and element-wise work are left out.

Formula, L layers, H query heads, c_layer = c_attn + c_mlp the linear work of one layer on one token:
    passes   sum over chunks of n (2 W - s) L c_layer
    path     + prompts x c_mlp x ((H + 1) L (L - 1) / 2 + H L)              an MLP per (sender so far, layer)
    direct   the same as path (its sweep adds the frozen MLP outputs, counted with path's as an upper bound)
    total    + prompts x ((H + 1) L (L - 1) / 2 x c_layer + H L x c_mlp)    one token through the layers above
    In forward passes of the prompts (the docs' unit, `prompt_forward_macs`): every prompt at its own length with
    its last token's unembedding, tokens x L x c_layer + prompts x d_vocab x d_model.

It is checked against the engine's counted work on a SmolLM2-shaped model in tests/unit/patching/test_cost.py,
and `arithmech plan` (plan/work.py) reads it for models it never loads.
"""

from __future__ import annotations

from collections.abc import Sequence

from arithmech.models.from_layer_cost import joined_token_layers

TOTAL_MAX_ROWS = 512
"""(sender, prompt) rows of one decoding step of the total scan: `total.total_patched_logits`'s default."""


def layer_macs(
    d_model: int, n_heads: int, n_kv_heads: int, d_head: int, d_mlp: int, mlp_matrices: int = 3
) -> tuple[int, int]:
    """(c_attn, c_mlp): the linear work of one layer's attention (q, o; k, v) and MLP on one token."""
    c_attn = 2 * d_model * n_heads * d_head + 2 * d_model * n_kv_heads * d_head
    return c_attn, mlp_matrices * d_model * d_mlp


def scan_macs(
    variant: str, n_layers: int, n_heads: int, c_attn: int, c_mlp: int, chunks: Sequence[tuple[int, int, int]]
) -> int:
    """The scan's multiply-accumulates; `chunks` are (prompts, width, shared start) of the engine's chunks."""
    c_layer = c_attn + c_mlp
    passes = sum(n * (2 * width - shared) * n_layers * c_layer for n, width, shared in chunks)
    prompts = sum(n for n, _, _ in chunks)
    triangle = (n_heads + 1) * n_layers * (n_layers - 1) // 2
    if variant == "total":
        return passes + prompts * (triangle * c_layer + n_heads * n_layers * c_mlp)
    return passes + prompts * c_mlp * (triangle + n_heads * n_layers)


def prompt_pass_macs(tokens: int, prompts: int, n_layers: int, c_layer: int, d_vocab: int, d_model: int) -> int:
    """One forward pass of the prompts, each at its own length, with its last token's unembedding (the unit)."""
    return tokens * n_layers * c_layer + prompts * d_vocab * d_model


def attribution_token_layers(n_layers: int, chunks: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """(forward, backward) token-layers of attribution patching (`attribution.attribution_patch`), chunks of
    (prompts, width): per chunk the counterfactual run and the reference run with gradients, then one backward
    through every layer of the reference run."""
    tokens = sum(n * width for n, width in chunks)
    return 2 * tokens * n_layers, tokens * n_layers


def patched_end_cost(
    n_layers: int, join: Sequence[int], ends: Sequence[int], max_rows: int = TOTAL_MAX_ROWS
) -> tuple[int, int]:
    """(token-layers, rows read out) of `total.patched_end_logits`: END residuals of senders joining at layers
    `join` (non-decreasing; n_layers = the final norm) on prompts whose last tokens are at `ends`. Prompts of
    one length form a group; each decoding step takes max(1, max_rows // group) senders of every prompt of the
    group, one position per slot, a stand-in slot below the first sender's layer
    (`from_layer_cost.joined_token_layers`). Every (sender, prompt) row is read out once: through the whole
    vocabulary when the caller passes `read` (agreement's answer probability), else its answer's row alone.
    The senders' residuals (`path.sender_resid`: one MLP per head sender when it recomputes the MLP) come on
    top, as does the reference pass that makes the cache."""
    groups: dict[int, int] = {}
    for end in ends:
        groups[end] = groups.get(end, 0) + 1
    token_layers = 0
    for size in groups.values():
        step = max(1, max_rows // size)
        for start in range(0, len(join), step):
            token_layers += size * joined_token_layers(n_layers, join[start : start + step], 1)
    return token_layers, len(join) * len(ends)
