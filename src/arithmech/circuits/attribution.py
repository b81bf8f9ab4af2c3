"""Edge attribution patching: a score for every edge of MIB's graph from a few forward and backward passes.

Background
    Patching one edge s -> r (r reads s's counterfactual output instead of its clean one) moves r's input by
    out_s(cf) - out_s(clean). To first order the metric moves by that times d m / d x_r, so
        score(s -> r) = (out_s(clean) - out_s(cf)) . d m / d x_r        summed over positions, mean over prompts
    estimates m(clean) - m(only s -> r patched): positive = the edge supports the clean behaviour.
    EAP (Syed et al. 2023) takes the gradient on the clean run: two forward passes (clean and counterfactual
    sender outputs) and one forward + backward pass with a probe on every receiver input (`patched.py`).
    EAP-IG on the inputs (Hanna et al. 2024, MIB's baseline) averages the gradient over m runs whose input
    embeddings are interpolated between the counterfactual and the clean prompt, at alpha = k / m, k = 1..m
    (the last one is the clean run), which integrates the gradient along the path (integrated gradients).

Formula, receiver r and sender s ([batch, pos, d_model] each, sum over batch, pos and d_model, then / prompts):
    EAP     score[r, s] = sum <out_s(clean) - out_s(cf), g_r(1)>
    EAP-IG  score[r, s] = sum <out_s(clean) - out_s(cf), mean_k g_r(k / m)>
    g_r(alpha) = d m / d x_r on the run whose token embeddings are e(cf) + alpha (e(clean) - e(cf)).
    m = logit[answer] - logit[cf answer] at END, summed over prompts (so each prompt's gradient is its own).

Cost, per chunk of prompts (F = one plain forward pass of the chunk, logits at every position included):
    1 plain pass for the counterfactual sender outputs (no unembedding: ~0.8 F);
    m (EAP: 1) forward + backward passes of the intact model (`gradients.py`: ~0.8 F forward, ~0.8 F backward,
    input gradients only, + the assembly of the 3H head-input gradients per layer); the clean sender outputs
    are kept from the alpha = 1 pass, which is the clean run;
    the contraction: edges x batch x pos x d_model multiply-accumulates (~0.5 F on SmolLM2).
    The first positions that every clean and counterfactual prompt share (MIB's "Q: How much is", 6 of 16
    tokens on SmolLM2) carry no score: they run once as a key/value cache and everything above covers the later
    positions only. EAP-IG with m = 5 on SmolLM2-135M: about 12 F, EAP about 3.5 F, by CPU time
    (benchmarks/circuits.py, 16 prompts, on a loaded machine); the issue's bound for EAP-IG is 20.
Memory: the accumulated gradients, 4 bytes x receivers x d_model per position and prompt (841 x 576 x 4 B =
1.9 MB on SmolLM2), the two runs' sender outputs (~2 x (2L + 1) x d_model numbers per position), their
differences per sender (4 bytes x senders x d_model per position) and one forward pass's autograd graph: at its
peak about 56 MiB per prompt of 16 positions (10 after the shared ones) on SmolLM2 in float32 (live tensors,
benchmarks/circuits.py), of which the kept tensors are 28 MiB.

References: Syed, Rager & Conmy 2023 (arXiv:2310.10348); Hanna, Pezzelle & Belinkov 2024 (COLM, EAP-IG);
Mueller et al. 2025 (MIB, m = 5 steps); METHODS.md sec. 9.
"""

from __future__ import annotations

from typing import Literal

import torch

from arithmech.circuits.attribution_cost import interpolation_points
from arithmech.circuits.batch import CircuitBatch
from arithmech.circuits.gradients import receiver_gradients
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.senders import SenderOutputs, collect_sender_outputs, head_outputs
from arithmech.models.view import ModelView
from arithmech.progress import Progress

AttributionMethod = Literal["eap", "eap-ig"]
ATTRIBUTION_METHODS: tuple[str, ...] = ("eap", "eap-ig")


def edge_scores(
    view: ModelView,
    graph: CircuitGraph,
    batch: CircuitBatch,
    method: AttributionMethod = "eap-ig",
    steps: int = 5,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> torch.Tensor:
    """Signed score of every edge [receiver, sender] float32 (0 off the edges), mean over prompts; `progress`
    counts forward and backward passes (one per interpolation step and chunk of prompts)."""
    alphas = interpolation_points(method, steps)
    total = torch.zeros(graph.n_receivers, graph.n_senders, dtype=torch.float64)
    chunks = batch.chunks(batch_size)
    if progress is not None:
        progress.total = len(chunks) * len(alphas)
    for chunk in chunks:
        shared = chunk.shared_positions  # no sender's output differs there: no score comes from them
        cf = collect_sender_outputs(view, chunk.cf_ids, chunk.mask).positions_from(shared)
        grads, clean = receiver_gradients(view, graph, chunk, alphas, shared, progress)  # alpha = 1: the clean run
        assert clean is not None
        total += contract(view, graph, sender_differences(view, clean, cf), grads).double().cpu()
    return (total / len(batch)).float() * graph.valid


@torch.no_grad()
def sender_differences(view: ModelView, clean: SenderOutputs, cf: SenderOutputs) -> torch.Tensor:
    """[sender, batch * pos * d_model] float32: out_s(clean) - out_s(cf), in sender order. The residual-sized
    outputs (embedding, MLPs) are subtracted in float32: two float16 outputs within its range can differ by more
    than its largest number (65,504), which the model's own forward never computes (benchmarks/skeleton_numerics.py)."""
    rows = [(clean.embed.float() - cf.embed.float())[None]]
    for layer in range(view.dims.n_layers):
        heads = head_outputs(view, layer, clean.z[layer] - cf.z[layer]).permute(2, 0, 1, 3)  # [head, batch, pos, d]
        rows += [heads, (clean.mlp_out[layer].float() - cf.mlp_out[layer].float())[None]]
    return torch.cat([r.float().flatten(1) for r in rows])


@torch.no_grad()
def contract(view: ModelView, graph: CircuitGraph, diffs: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """[receiver, sender]: sum over batch, pos and d_model of diffs[s] x grads[r] (garbage off the edges).

    One matrix product per layer of receivers, with the senders they can read (a prefix in sender order):
    each gradient row is read once and the multiply-accumulates are about edges x batch x pos x d_model."""
    g = grads.flatten(1)  # [receiver, batch * pos * d_model]
    scores = g.new_zeros(graph.n_receivers, graph.n_senders)
    for layer in range(graph.n_layers):
        rows = graph.layer_receivers(layer)
        n = max(graph.senders_before(r) for r in range(rows.start, rows.stop))
        scores[rows, :n] = g[rows] @ diffs[:n].T
    r = graph.logits_receiver
    scores[r] = diffs @ g[r]
    return scores
