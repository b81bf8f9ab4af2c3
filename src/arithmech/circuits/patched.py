"""Evaluate a circuit exactly, in one patched forward pass: every receiver's input rebuilt from its senders.

Background
    A circuit C keeps some edges of MIB's graph (`graph.py`). Running the model "with only C" means: every
    receiver r reads, from each sender s before it, s's output in this very run if s -> r is in C, and s's
    output on the counterfactual prompt (or its mean, for mean ablation) if not. Senders inside C keep
    computing from their own patched inputs, so effects travel along the circuit's paths.

Formula (METHODS.md sec. 9), at every position, with keep[r, s] in [0, 1] (1 = edge in C):
    x_r = resid_r + sum_s (1 - keep[r, s]) (out_s(ablated) - out_s(this run))        [batch, pos, d_model]
    resid_r is the residual r would read in this run (the sum of all sender outputs and biases), so the
    biases stay and only the swapped terms change. An empty circuit gives the counterfactual run, the full
    circuit the clean run (tested). r applies its own norm to x_r: each head's query, key and value input
    and each MLP input is normed separately.

How it runs as one forward pass of the unmodified Hugging Face model (hooks only, `models/hooks.py`)
    attn_norm pre-hook   builds the 3H inputs x_{h,q|k|v} [3H, batch, pos, d_model] and norms them.
    q/k/v post-hooks     replace the projections: query head h's queries from x_{h,q} with its W_Q block;
                         keys and values from x_{h,k}, x_{h,v} with the W_K, W_V block of h's kv group.
    o_proj pre-hook      records z, hence each head's output and its swap term out_s(ablated) - out_s(run).
    mlp_norm pre-hook    replaces the MLP's input; mlp post-hook records its output.
    final_norm pre-hook  replaces the logits' input and keeps it at END for the metric.
    Grouped-query attention: the keys of kv head k may differ for each of its g query heads (their inputs
    differ), but the attention kernel takes one key per kv head. The attention module therefore runs on g
    replicas of the batch (a pre-hook repeats its hidden states, mask and rotary tables): replica j holds the
    keys/values of query head k g + j for every kv head k, and head h's z is read from replica h mod g, so the
    o_proj input, and everything after it, is one batch again. The key/value weights are never copied (one
    [kv head, d_head, d_model] view, applied by einsum); the price is g times the attention's compute (the MLPs
    run once; g = 1 without grouped-query attention).

Starting later (`clean_prefix.py`, for the oracle): with `start`, a pass whose circuits keep every edge into the
layers below `start.layer` runs only layers start.layer.. on positions start.position.., from the clean run's
residual and keys/values, with the swap terms of the senders below given.

Gradients (for EAP, `attribution.py`): with `probe=True` a zero tensor requiring grad is added to every
receiver's input, so d metric / d probe = d metric / d x_r for each receiver separately.

References: Mueller et al. 2025 (MIB), section 4 and appendix on circuit evaluation; METHODS.md sec. 9.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from arithmech.circuits.batch import at_end
from arithmech.circuits.clean_prefix import PassStart
from arithmech.circuits.graph import ROLES, CircuitGraph
from arithmech.circuits.senders import SenderOutputs, check_edge_graph
from arithmech.models.hooks import PostHook, PreHook, first_tensor, hooks
from arithmech.models.view import ModelView

_BATCH_KWARGS = ("attention_mask", "position_embeddings", "position_ids")
"""Keyword arguments of an attention module that hold one row per prompt (or one row for all)."""


def projection_weights(view: ModelView, layer: int) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Q, K, V weights as views [n, d_head, d_model] (n: query heads for q, kv heads for k, v), biases [n, d_head]."""
    d, s = view.dims, view.spec
    counts = {"q": d.n_heads, "k": d.n_kv_heads, "v": d.n_kv_heads}

    def as_rows(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = module.weight
        return (w.T if s.conv1d else w), getattr(module, "bias", None)  # [out, d_model], [out]

    if s.qkv_layout == "separate":
        out = {}
        for role, path in zip(ROLES, (s.q_proj, s.k_proj, s.v_proj), strict=True):
            w, b = as_rows(view.module(layer, str(path)))
            n = counts[role]
            out[role] = (w.reshape(n, d.d_head, -1), None if b is None else b.reshape(n, d.d_head))
        return out
    w, b = as_rows(view.module(layer, str(s.qkv_proj)))
    if s.qkv_layout == "interleaved":  # per head [q_h | k_h | v_h]; no grouped-query attention
        w3 = w.reshape(d.n_heads, 3, d.d_head, -1)  # [head, role, d_head, d_model]
        b3 = None if b is None else b.reshape(d.n_heads, 3, d.d_head)
        return {role: (w3[:, i], None if b3 is None else b3[:, i]) for i, role in enumerate(ROLES)}
    out, start = {}, 0
    for role in ROLES:
        rows = counts[role] * d.d_head
        wr = w[start : start + rows].reshape(counts[role], d.d_head, -1)
        br = None if b is None else b[start : start + rows].reshape(counts[role], d.d_head)
        out[role], start = (wr, br), start + rows
    return out


@dataclass
class _Run:
    """State of one patched forward pass; replica 0 of the batch carries every recorded tensor."""

    view: ModelView
    graph: CircuitGraph
    swap: torch.Tensor  # [circuit, receiver, sender] (1 - keep) on edges, 0 elsewhere; batch = circuit x prompt
    ablated: SenderOutputs
    end: torch.Tensor
    batch: int
    replicas: int
    probe: bool
    needs_swaps: bool
    terms: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    """(first sender, [senders, batch, pos, d_model] out(ablated) - out(run)) in sender order."""
    normed: dict[str, torch.Tensor] = field(default_factory=dict)
    probes: list[torch.Tensor] = field(default_factory=list)
    end_resid: torch.Tensor | None = None

    def receiver_input(self, receivers: slice, resid: torch.Tensor) -> torch.Tensor:
        """[receivers, batch, pos, d_model]: resid plus the swap terms of the edges outside the circuit."""
        n = receivers.stop - receivers.start
        x = resid[: self.batch][None].expand(n, -1, -1, -1)
        if self.needs_swaps:
            coeff = self.swap[:, receivers].to(resid.dtype)  # [circuit, receivers, sender]
            circuits = coeff.shape[0]
            for start, term in self.terms:
                c = coeff[:, :, start : start + term.shape[0]]
                if bool(c.any()) and term.shape[1] != self.batch:  # [s, prompt, pos, d] shared by circuits (PassStart)
                    x = x + torch.einsum("crs,sbpd->rcbpd", c, term).reshape(n, *x.shape[1:])
                elif bool(c.any()):
                    t = term.reshape(term.shape[0], circuits, -1, *term.shape[2:])  # [s, circuit, prompt, pos, d]
                    x = x + torch.einsum("crs,scbpd->rcbpd", c, t).reshape(n, *x.shape[1:])
        if self.probe:
            probe = torch.zeros_like(x, requires_grad=True)
            self.probes.append(probe)
            x = x + probe
        return x

    def tiled(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, ...] -> [replicas * batch, ...] (replica-major)."""
        return x if self.replicas == 1 else x.repeat(self.replicas, *([1] * (x.dim() - 1)))

    def add_terms(self, start: int, run_out: torch.Tensor, ablated_out: torch.Tensor) -> None:
        if self.needs_swaps:
            self.terms.append((start, ablated_out - run_out))

    # -- hooks --------------------------------------------------------------------------------------------
    def attn_inputs(self, layer: int) -> PreHook:
        norm = self.view.attn_norm(layer)

        def fn(_module: nn.Module, args: tuple[Any, ...]) -> None:
            resid = args[0]
            if layer == 0:
                self.add_terms(0, resid[: self.batch][None], self.ablated.embed[None])
            heads = self.graph.layer_receivers(layer)
            x = self.receiver_input(slice(heads.start, heads.stop - 1), resid)  # [3H, batch, pos, d_model]
            normed = norm.forward(x)  # forward: not through this hook again
            h = self.view.dims.n_heads
            self.normed = {role: normed[i * h : (i + 1) * h] for i, role in enumerate(ROLES)}

        return fn

    def projections(self, layer: int) -> dict[str, torch.Tensor]:
        """Module-layout outputs [replicas * batch, pos, n * d_head] of q, k and v from the per-head inputs."""
        d = self.view.dims
        g = d.group_size
        out = {}
        for role, (w, b) in projection_weights(self.view, layer).items():
            x = self.normed[role].to(w.dtype)  # [head, batch, pos, d_model]
            if role == "q":
                y = torch.einsum("hbpm,hem->bphe", x, w)[None].expand(self.replicas, -1, -1, -1, -1)
            else:  # query head k*g + j of kv group k goes to replica j
                x = x.reshape(d.n_kv_heads, g, *x.shape[1:])  # [kv, group, batch, pos, d_model]
                y = torch.einsum("kgbpm,kem->gbpke", x, w)  # [replicas = group, batch, pos, kv, d_head]
            if b is not None:
                y = y + b  # [replicas, batch, pos, n, d_head]
            out[role] = y.reshape(-1, *y.shape[2:])  # [replicas * batch, pos, n, d_head]
        return out

    def projection_hooks(self, layer: int) -> list[tuple[nn.Module, PostHook]]:
        s = self.view.spec
        if s.qkv_layout == "separate":
            modules = [self.view.module(layer, str(p)) for p in (s.q_proj, s.k_proj, s.v_proj)]
            cache: dict[str, torch.Tensor] = {}

            def role_hook(role: str) -> PostHook:
                def fn(_module: nn.Module, _args: Any, _output: Any) -> torch.Tensor:
                    if role not in cache:  # the first projection called computes all three
                        cache.update(self.projections(layer))
                    return cache.pop(role).flatten(-2)

                return fn

            return [(m, role_hook(role)) for m, role in zip(modules, ROLES, strict=True)]

        def fused(_module: nn.Module, _args: Any, _output: Any) -> torch.Tensor:
            p = self.projections(layer)
            if s.qkv_layout == "interleaved":
                return torch.stack([p[r] for r in ROLES], dim=-2).flatten(-3)  # [.., head, role, d_head] flat
            return torch.cat([p[r].flatten(-2) for r in ROLES], dim=-1)

        return [(self.view.module(layer, str(s.qkv_proj)), fused)]

    def attention_replicas(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The attention module's batch inputs repeated `replicas` times (replica-major); others unchanged."""
        if args:
            args = (self.tiled(args[0]), *args[1:])
        else:
            kwargs = {**kwargs, "hidden_states": self.tiled(kwargs["hidden_states"])}
        for name in _BATCH_KWARGS:
            value = kwargs.get(name)
            if isinstance(value, torch.Tensor):
                kwargs[name] = self.batch_tiled(value)
            elif isinstance(value, tuple):
                kwargs[name] = tuple(self.batch_tiled(v) if isinstance(v, torch.Tensor) else v for v in value)
        for name, value in kwargs.items():
            if hasattr(value, "update") and not isinstance(value, dict):  # a prefix cache (PassStart)
                kwargs[name] = _ReplicaCache(value, self.replicas, self.batch)
        return args, kwargs

    def batch_tiled(self, x: torch.Tensor) -> torch.Tensor:
        """A per-prompt tensor [batch, ...] repeated over the replicas; one broadcast over the batch stays."""
        return self.tiled(x) if x.shape[0] == self.batch and self.batch > 1 else x

    def head_outputs(self, layer: int) -> PreHook:
        d = self.view.dims
        g = self.replicas

        def fn(_module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...] | None:
            z = args[0]  # [replicas * batch, pos, head * d_head]
            if g > 1:  # head k*g + j from replica j
                z6 = z.reshape(g, self.batch, z.shape[1], d.n_kv_heads, g, d.d_head)
                z = torch.diagonal(z6, dim1=0, dim2=4)  # [batch, pos, kv, d_head, group]
                z = z.permute(0, 1, 2, 4, 3).reshape(self.batch, z.shape[1], -1)  # [batch, pos, head * d_head]
            if self.needs_swaps:
                run_out = self.view.head_outputs(layer, z).permute(2, 0, 1, 3)  # [head, batch, pos, d_model]
                self.add_terms(self.graph.head_sender(layer, 0), run_out, self.ablated.head_outputs(self.view, layer))
            return (z,) if g > 1 else None

        return fn

    def mlp_input(self, layer: int) -> PreHook:
        receiver = self.graph.mlp_receiver(layer)

        def fn(_module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
            return (self.receiver_input(slice(receiver, receiver + 1), args[0])[0],)  # [batch, pos, d_model]

        return fn

    def mlp_output(self, layer: int) -> PostHook:
        def fn(_module: nn.Module, _args: Any, output: Any) -> None:
            out = first_tensor(output)[: self.batch]
            self.add_terms(self.graph.mlp_sender(layer), out[None], self.ablated.mlp_out[layer][None])

        return fn

    def logits_input(self, _module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        r = self.graph.logits_receiver
        x = self.receiver_input(slice(r, r + 1), args[0])[0]  # [batch, pos, d_model]
        self.end_resid = at_end(x, self.end)
        return (x,)


class _ReplicaCache:
    """A read-only prefix cache seen by the attention's replicas of the batch: each replica the batch's keys."""

    def __init__(self, cache: Any, replicas: int, batch: int) -> None:
        self.cache, self.replicas, self.batch = cache, replicas, batch

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """[replicas * batch, kv_head, prefix + pos, d_head] each: the prefix repeated, then the new keys."""
        none = key_states[: self.batch, :, :0], value_states[: self.batch, :, :0]
        keys, values = self.cache.update(*none, *args, **kwargs)  # [batch, kv_head, prefix, d_head]
        tiled = [t.repeat(self.replicas, 1, 1, 1) for t in (keys, values)]
        return torch.cat([tiled[0], key_states], dim=-2), torch.cat([tiled[1], value_states], dim=-2)


def patched_end_resid(
    view: ModelView,
    graph: CircuitGraph,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: torch.Tensor,
    ablated: SenderOutputs,
    probe: bool = False,
    extra_post: Sequence[tuple[nn.Module, PostHook]] = (),
    start: PassStart | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The logits' input at END [batch, d_model] with circuit `keep` [receiver, sender], and the probes.

    keep: 1 = edge in the circuit, 0 = swapped for `ablated` (fractions interpolate linearly). A batch of
    circuits, keep [circuit, receiver, sender], runs every prompt under each: rows are circuit-major
    (row c * prompts + i) and the result is [circuit * prompts, d_model]. With `probe`,
    the returned probes (in order: per layer the 3H head inputs then the MLP input, last the logits) are
    leaves whose gradient is d metric / d receiver input. `extra_post` hooks (e.g. on the input embedding)
    run too. Gradients flow only when called under grad mode. `start` (no probes): begin at a later layer and
    position (see above); every circuit must keep all edges into the receivers below `start.layer`.
    """
    check_edge_graph(view)
    d = view.dims
    device = view.o_proj(0).weight.device
    swap = ((1 - keep.to(torch.float32)) * graph.valid).to(device)
    swap = swap if swap.dim() == 3 else swap[None]  # [circuit, receiver, sender]
    circuits = int(swap.shape[0])
    first, offset = (0, 0) if start is None else (start.layer, start.position)
    if start is not None:
        if bool(swap[:, : start.first_receiver].any()) or probe:
            raise ValueError("a pass that starts late must keep every edge below its layer (and has no probes)")
        ablated = start.ablated(ablated)
    if circuits > 1:
        input_ids, attention_mask = input_ids.repeat(circuits, 1), attention_mask.repeat(circuits, 1)
        ablated = ablated.repeat(circuits)
    batch = int(input_ids.shape[0])
    run = _Run(
        view=view, graph=graph, swap=swap, ablated=ablated, end=attention_mask.long().sum(-1) - 1 - offset,
        batch=batch, replicas=d.group_size, probe=probe, needs_swaps=bool(swap.any()),
    )  # fmt: skip
    if start is not None and run.needs_swaps:
        run.terms = list(start.terms)
    pre: list[tuple[nn.Module, PreHook]] = [(view.final_norm, run.logits_input)]
    post: list[tuple[nn.Module, PostHook]] = list(extra_post)
    for layer in range(first, d.n_layers):
        pre += [
            (view.attn_norm(layer), run.attn_inputs(layer)),
            (view.o_proj(layer), run.head_outputs(layer)),
            (view.mlp_norm(layer), run.mlp_input(layer)),
        ]
        post += [*run.projection_hooks(layer), (view.mlp(layer), run.mlp_output(layer))]
    ids, mask = input_ids.to(device), attention_mask.to(device)
    layers = range(first, d.n_layers)
    replicas = [(view.attn(layer), run.attention_replicas) for layer in layers] if run.replicas > 1 else []
    with hooks(pre=pre, post=post, pre_kwargs=replicas):
        if start is None:
            view.model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
        else:
            start.run(view, circuits)
    assert run.end_resid is not None
    return run.end_resid, run.probes
