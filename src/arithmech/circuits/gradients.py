"""d metric / d (every receiver's input) on the intact model, from one forward and one backward pass.

Background
    EAP and EAP-IG (`attribution.py`) need g_r = d m / d x_r for every receiver r of MIB's graph: each head's
    query, key and value input, each MLP input and the logits' input. With every edge in the circuit all the
    3H head inputs of a layer equal that layer's residual, so the run is the plain model; only the gradient
    must be taken for each receiver separately. `patched.py` could do it (a probe on each of the 3H inputs,
    normed 3H times), but that multiplies the norm and the projections by 3H in the forward and the backward.
    Here the model runs once, as it is, and each head input's gradient is assembled after the backward:
        g_{h,role} = J_norm(resid)^T (W_role[h]^T d m / d y_{h,role})             [batch, pos, d_model]
    where y_{h,role} is the query, key or value (before rotary) that query head h reads and J_norm is the
    Jacobian of the attention norm at the layer's residual (the same for the 3H inputs of a layer). The norm's
    vector-Jacobian product is taken by autograd for the 3H cotangents at once (the model's own norm module,
    any family). The MLP and logits inputs get a zero probe each (one input, one norm: nothing multiplied).

Grouped-query attention: query head h's key and value must get their own gradient although its kv head is
shared; the attention module runs on g replicas (`replicas.py`), the projections once (their output is repeated
by a hook), and d m / d y is read from the replica of each query head. No key/value weight is copied.

Cost of one pass (SmolLM2-135M, prompts of ~16 tokens; F = one plain forward pass of the batch, logits at every
position included):
    forward   the model without the unembedding (~0.8 F) + g x the attention scores and mixing (small);
    backward  input gradients only, no weight gradients (~0.8 F);
    assembly  3H x d_head x d_model multiply-accumulates per token and layer (W_role^T d m/dy: ~0.2 F), the
              norm's vector-Jacobian product on 3H x d_model per token and layer (elementwise).
Memory: the plain forward's autograd graph (activations of one forward, the attention's g times), the probes
([batch, pos, (H + 2 H_kv) d_head] x g per layer) and the result, R x batch x pos x d_model
(R = L (3H + 1) + 1 receivers: 4 bytes x 841 x 576 = 1.9 MB per token in float32 on SmolLM2). Once the backward
has freed the graph: the probes' gradients and one layer's assembly, a few float32 [3H, batch, pos, d_model]
tensors; both are freed before the next interpolation point's forward (plan/memory.py edge_attribution_memory).

References: Syed, Rager & Conmy 2023 (EAP); Hanna et al. 2024 (EAP-IG); METHODS.md sec. 9.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from arithmech.circuits.batch import CircuitBatch, at_end, logit_difference
from arithmech.circuits.graph import ROLES, CircuitGraph
from arithmech.circuits.patched import projection_weights
from arithmech.circuits.replicas import GroupReplicas
from arithmech.circuits.senders import SenderOutputs, check_edge_graph, mlp_sender, scaled_z
from arithmech.models.hooks import PostHook, PreHook, first_tensor, hooks
from arithmech.models.view import ModelView
from arithmech.progress import Progress


@dataclass
class _Pass:
    """What one forward pass keeps for the backward and for the assembly of the receiver gradients."""

    view: ModelView
    replicas: GroupReplicas
    keep_outputs: bool
    resid: list[torch.Tensor] = field(default_factory=list)  # per layer [batch, pos, d_model], the norm's input
    projection_probes: list[torch.Tensor] = field(default_factory=list)  # per layer: [replicas * batch, pos, out]
    mlp_probes: list[torch.Tensor] = field(default_factory=list)  # per layer [batch, pos, d_model]
    logits_probe: torch.Tensor | None = None
    end_resid: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    """The current layer's attention input [batch, pos, d_model]."""
    z: list[torch.Tensor] = field(default_factory=list)
    mlp_out: list[torch.Tensor] = field(default_factory=list)

    def probed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probe = torch.zeros_like(x, requires_grad=True)
        return x + probe, probe

    # -- hooks --------------------------------------------------------------------------------------------
    def attn_input(self, _module: nn.Module, args: tuple[Any, ...]) -> None:
        self.resid.append(args[0].detach())

    def attention_inputs(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Keeps the attention's input for the projections; the replicas' copy of it carries no gradient."""
        self.hidden = args[0] if args else kwargs["hidden_states"]
        if self.replicas.replicas == 1:
            return None
        if args:
            return self.replicas.attention_inputs(module, (self.hidden.detach(), *args[1:]), kwargs)
        return self.replicas.attention_inputs(module, args, {**kwargs, "hidden_states": self.hidden.detach()})

    def projection_input(self, _module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The projections run once, on the attention's input; `projection_output` repeats their result."""
        assert self.hidden is not None
        return (self.hidden, *args[1:])

    def projection_output(self, _module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
        y, probe = self.probed(self.replicas.tiled(output))
        self.projection_probes.append(probe)
        return y

    def head_outputs(self, _module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        z = self.replicas.heads_from_replicas(args[0])
        if self.keep_outputs:
            self.z.append(scaled_z(self.view, len(self.z), z.detach()))
        return (z, *args[1:])

    def mlp_input(self, _module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        x, probe = self.probed(args[0])
        self.mlp_probes.append(probe)
        return (x, *args[1:])

    def mlp_output(self, _module: nn.Module, _args: Any, output: Any) -> None:
        if self.keep_outputs:
            self.mlp_out.append(first_tensor(output).detach())

    def logits_input(self, end: torch.Tensor) -> PreHook:
        def fn(_module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
            x, self.logits_probe = self.probed(args[0])
            self.end_resid = at_end(x, end)
            return (x, *args[1:])

        return fn

    # -- after the backward -------------------------------------------------------------------------------
    def head_input_gradients(self, layer: int, d_projections: list[torch.Tensor]) -> torch.Tensor:
        """[3H, batch, pos, d_model] (role-major) from d m / d the projection outputs [replicas * batch, pos, out]."""
        view, d = self.view, self.view.dims
        per_role = _role_tensors(view, d_projections)
        cotangents = []
        for role, (w, _) in projection_weights(view, layer).items():  # w: [n, d_head, d_model]
            dy = self.replicas.per_query_head(per_role[role], int(w.shape[0]))  # [head, batch, pos, d_head]
            if role == "q" or w.shape[0] == d.n_heads:
                cotangents.append(torch.einsum("hbpe,hem->hbpm", dy.to(w.dtype), w))
            else:  # query head k g + j uses kv head k's block
                dy = dy.reshape(d.n_kv_heads, d.group_size, *dy.shape[1:])
                u = torch.einsum("kgbpe,kem->kgbpm", dy.to(w.dtype), w)
                cotangents.append(u.reshape(d.n_heads, *u.shape[2:]))
        u = torch.cat(cotangents)  # [3H, batch, pos, d_model]: d m / d (normed input of each receiver)
        with torch.enable_grad():
            x = self.resid[layer].detach().requires_grad_(True)
            normed = view.attn_norm(layer).forward(x)
            (dx,) = torch.autograd.grad(normed, x, grad_outputs=u.to(normed.dtype), is_grads_batched=True)
        return dx


def _role_tensors(view: ModelView, outputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Projection outputs (or their gradients) [rows, pos, out], one per module -> per role [rows, pos, n, d_head]."""
    d, s = view.dims, view.spec
    if s.qkv_layout == "separate":
        return {role: y.reshape(*y.shape[:2], -1, d.d_head) for role, y in zip(ROLES, outputs, strict=True)}
    (y,) = outputs
    if s.qkv_layout == "interleaved":  # per head [q_h | k_h | v_h]
        y5 = y.reshape(*y.shape[:2], d.n_heads, 3, d.d_head)
        return {role: y5[:, :, :, i] for i, role in enumerate(ROLES)}
    sizes = [d.n_heads * d.d_head, d.n_kv_heads * d.d_head, d.n_kv_heads * d.d_head]
    parts = torch.split(y, sizes, dim=-1)
    return {role: p.reshape(*p.shape[:2], -1, d.d_head) for role, p in zip(ROLES, parts, strict=True)}


def interpolated_embedding(view: ModelView, cf_ids: torch.Tensor, alpha: float) -> tuple[nn.Module, PostHook]:
    """A post-hook on the token embedding: e(cf) + alpha (e(clean) - e(cf)), computed in float32 (the difference of
    two float16 embeddings can overflow where neither does; the point between them cannot) and cast back."""
    module = view.model.get_input_embeddings()

    def fn(_module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            cf_embed = module.forward(cf_ids.to(output.device)).float()
        return (cf_embed + alpha * (output.float() - cf_embed)).to(output.dtype)

    return module, fn


def receiver_gradients(
    view: ModelView,
    graph: CircuitGraph,
    chunk: CircuitBatch,
    alphas: Sequence[float],
    shared: int = 0,
    progress: Progress | None = None,
) -> tuple[torch.Tensor, SenderOutputs | None]:
    """Mean over the interpolation points alpha of d (sum of m) / d x_r, [receiver, batch, pos, d_model] float32,
    and the clean run's sender outputs when alpha = 1 is among them (that run is the clean run).

    The run at alpha has token embeddings e(cf) + alpha (e(clean) - e(cf)); alpha = 1 is the clean run.
    shared: the first positions, the same tokens in every clean and counterfactual prompt
    (`CircuitBatch.shared_positions`), run once as a key/value cache; both results then start after them
    (pos - shared positions), where every sender's clean and counterfactual outputs may differ. `progress` is
    advanced by one after each alpha's forward and backward pass."""
    check_edge_graph(view)
    d = view.dims
    device = view.o_proj(0).weight.device
    ids, mask = chunk.clean_ids[:, shared:].to(device), chunk.mask.to(device)  # the mask stays whole
    batch, pos = int(ids.shape[0]), int(ids.shape[1])
    mean = torch.zeros(graph.n_receivers, batch, pos, d.d_model, dtype=torch.float32, device=device)
    clean: SenderOutputs | None = None
    for alpha in alphas:
        run = _Pass(view=view, replicas=GroupReplicas(d, batch), keep_outputs=alpha == 1.0)
        with torch.enable_grad():
            inputs = run.replicas.shared_start(view, chunk.clean_ids[0, :shared])
            with hooks(*_hook_lists(view, run, chunk, alpha, shared)):
                view.model.base_model(input_ids=ids, attention_mask=mask, **inputs)
            assert run.end_resid is not None and run.logits_probe is not None
            metric = logit_difference(view, run.end_resid, chunk).sum()
            probes = [*run.projection_probes, *run.mlp_probes, run.logits_probe]
            grads = list(torch.autograd.grad(metric, probes))
        _accumulate(mean, view, graph, run, grads, 1.0 / len(alphas))
        del grads, probes, metric  # freed before the next point's forward, not kept through it
        if run.keep_outputs:
            clean = SenderOutputs(embed=run.resid[0], z=torch.stack(run.z), mlp_out=torch.stack(run.mlp_out))
        if progress is not None:
            progress.update(1)
    return mean, clean


def _hook_lists(
    view: ModelView, run: _Pass, chunk: CircuitBatch, alpha: float, shared: int
) -> tuple[list[tuple[nn.Module, PreHook]], list[tuple[nn.Module, PostHook]], list[tuple[nn.Module, Any]]]:
    s = view.spec
    pre: list[tuple[nn.Module, PreHook]] = [(view.final_norm, run.logits_input(chunk.end - shared))]
    post: list[tuple[nn.Module, PostHook]] = (
        [] if alpha == 1.0 else [interpolated_embedding(view, chunk.cf_ids[:, shared:], alpha)]
    )
    for layer in range(view.dims.n_layers):
        paths = [s.q_proj, s.k_proj, s.v_proj] if s.qkv_layout == "separate" else [s.qkv_proj]
        projections = [view.module(layer, str(p)) for p in paths]
        pre += [(view.attn_norm(layer), run.attn_input), (view.o_proj(layer), run.head_outputs)]
        pre += [(m, run.projection_input) for m in projections] + [(view.mlp_norm(layer), run.mlp_input)]
        post += [(m, run.projection_output) for m in projections] + [(mlp_sender(view, layer), run.mlp_output)]
    return pre, post, [(view.attn(layer), run.attention_inputs) for layer in range(view.dims.n_layers)]


@torch.no_grad()
def _accumulate(
    mean: torch.Tensor, view: ModelView, graph: CircuitGraph, run: _Pass, grads: list[torch.Tensor], weight: float
) -> None:
    """mean[r] += weight x g_r for every receiver."""
    n_layers = view.dims.n_layers
    per_layer = len(run.projection_probes) // n_layers  # 3 separate projections or 1 fused
    for layer in range(n_layers):
        dx = run.head_input_gradients(layer, grads[layer * per_layer : (layer + 1) * per_layer])
        heads = graph.layer_receivers(layer)
        mean[heads.start : heads.stop - 1].add_(dx, alpha=weight)
        mean[graph.mlp_receiver(layer)].add_(grads[n_layers * per_layer + layer], alpha=weight)
    mean[graph.logits_receiver].add_(grads[-1], alpha=weight)
