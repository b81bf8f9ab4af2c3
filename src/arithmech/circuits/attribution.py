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

Cost, per chunk of prompts: 2 plain forward passes + (1 or m) patched forward passes with gradients and their
backward passes; then a [receiver, sender] contraction over batch x pos x d_model. Under grouped-query attention
the patched pass runs the attention on g replicas (`patched.py`), so keys and values get a gradient per query
head, as MIB counts.

References: Syed, Rager & Conmy 2023 (arXiv:2310.10348); Hanna, Pezzelle & Belinkov 2024 (COLM, EAP-IG);
Mueller et al. 2025 (MIB, m = 5 steps); METHODS.md sec. 9.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn

from arithmech.circuits.batch import CircuitBatch, logit_difference
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.patched import patched_end_resid
from arithmech.circuits.senders import SenderOutputs, collect_sender_outputs
from arithmech.models.view import ModelView

AttributionMethod = Literal["eap", "eap-ig"]
ATTRIBUTION_METHODS: tuple[str, ...] = ("eap", "eap-ig")


def edge_scores(
    view: ModelView,
    graph: CircuitGraph,
    batch: CircuitBatch,
    method: AttributionMethod = "eap-ig",
    steps: int = 5,
    batch_size: int = 8,
    progress: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Signed score of every edge [receiver, sender] float32 (0 off the edges), mean over prompts."""
    alphas = [1.0] if method == "eap" else [k / steps for k in range(1, steps + 1)]
    total = torch.zeros(graph.n_receivers, graph.n_senders, dtype=torch.float64)
    for chunk in batch.chunks(batch_size):
        clean = collect_sender_outputs(view, chunk.clean_ids, chunk.mask)
        cf = collect_sender_outputs(view, chunk.cf_ids, chunk.mask)
        grads = receiver_gradients(view, graph, chunk, cf, alphas)
        total += _contract(view, graph, clean, cf, grads).double().cpu()
        if progress is not None:
            progress(len(chunk))
    return (total / len(batch)).float() * graph.valid


def receiver_gradients(
    view: ModelView, graph: CircuitGraph, chunk: CircuitBatch, cf: SenderOutputs, alphas: list[float]
) -> torch.Tensor:
    """d (sum of m) / d x_r [receiver, batch, pos, d_model], averaged over the interpolation points."""
    keep = torch.ones(graph.n_receivers, graph.n_senders)
    mean: torch.Tensor | None = None
    for alpha in alphas:
        extra = [] if alpha == 1.0 else [_interpolated_embedding(view, chunk.cf_ids, alpha)]
        with torch.enable_grad():
            end_resid, probes = patched_end_resid(
                view, graph, chunk.clean_ids, chunk.mask, keep, cf, probe=True, extra_post=extra
            )
            metric = logit_difference(view, end_resid, chunk).sum()
            grads = torch.autograd.grad(metric, probes)
        g = torch.cat([grad.detach() for grad in grads]) / len(alphas)  # [receiver, batch, pos, d_model]
        mean = g if mean is None else mean + g
    assert mean is not None
    return mean


def _interpolated_embedding(view: ModelView, cf_ids: torch.Tensor, alpha: float) -> tuple[nn.Module, Any]:
    """A post-hook on the token embedding: e(cf) + alpha (e(clean) - e(cf)) (batch replicas included)."""
    module = view.model.get_input_embeddings()

    def fn(_module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
        replicas = output.shape[0] // cf_ids.shape[0]
        with torch.no_grad():
            cf_embed = module.forward(cf_ids.to(output.device).repeat(replicas, 1))
        return cf_embed + alpha * (output - cf_embed)

    return module, fn


@torch.no_grad()
def _contract(
    view: ModelView, graph: CircuitGraph, clean: SenderOutputs, cf: SenderOutputs, grads: torch.Tensor
) -> torch.Tensor:
    """Sum over batch, pos and d_model of (out_s(clean) - out_s(cf)) x g_r, [receiver, sender]."""
    scores = grads.new_zeros(graph.n_receivers, graph.n_senders)
    g = grads.flatten(1)  # [receiver, batch * pos * d_model]
    scores[:, 0] = g @ (clean.embed - cf.embed).to(g.dtype).flatten()
    for layer in range(graph.n_layers):
        first = graph.layer_receivers(layer).start  # no earlier receiver reads this layer
        heads = view.head_outputs(layer, clean.z[layer] - cf.z[layer]).permute(2, 0, 1, 3)  # [head, batch, pos, d]
        s0 = graph.head_sender(layer, 0)
        scores[first:, s0 : s0 + graph.n_heads] = g[first:] @ heads.flatten(1).to(g.dtype).T
        mlp = (clean.mlp_out[layer] - cf.mlp_out[layer]).to(g.dtype).flatten()
        scores[first:, graph.mlp_sender(layer)] = g[first:] @ mlp
    return scores
