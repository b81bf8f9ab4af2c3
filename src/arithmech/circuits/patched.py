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
    attn_norm pre-hook   builds the 3H inputs x_{h,q|k|v}: the input they share in each circuit (the residual,
                         or for a small circuit the residual with every edge swapped) and the few that deviate
                         from it (`swaps.py`), one circuit at a time, norms each distinct one once and projects a
                         deviating one at once: query head h's queries with its W_Q block, keys and values with
                         the W_K, W_V block of h's kv group (only d_head numbers a row are kept, `project_own`).
    q/k/v post-hooks     replace the projections: every head's from the shared input, then the deviating ones'
                         own (the module itself computes one position only: `skipped_input`).
    o_proj pre-hook      records z, hence each head's output and its swap term out_s(ablated) - out_s(run).
    mlp_norm pre-hook    replaces the MLP's input; mlp post-hook records its output.
    final_norm pre-hook  replaces the logits' input and keeps it at END for the metric.
    Grouped-query attention: the keys of kv head k may differ for each of its g query heads (their inputs
    differ), but the attention kernel takes one key per kv head. The attention module therefore runs on g
    replicas of the batch (`replicas.py`): replica j holds the keys/values of query head k g + j for every kv
    head k, and head h's z is read from replica h mod g, so the o_proj input, and everything after it, is one
    batch again. The key/value weights are never copied (one [kv head, d_head, d_model] view, applied by
    einsum); the price is g times the attention scores and mixing (g = 1 without grouped-query attention).

Cost of one circuit x prompt row (SmolLM2-135M, ~16 positions; F = one plain forward pass with logits at every
position): the model without its unembedding (~0.8 F) plus the swap terms (`swaps.py`: up to edges x pos x
d_model multiply-accumulates, ~0.5 F for a dense circuit, near 0 for a small one) plus the deviating head inputs'
norms and per-head projections (up to 3H of them per layer). Memory: the swap terms of every sender,
4 bytes x senders x pos x d_model per row (301 x 576 x 4 B = 0.7 MB per position on SmolLM2).

Starting later (`clean_prefix.py`, for the oracle): with `start`, a pass whose circuits keep every edge into the
layers below `start.layer` runs only layers start.layer.. on positions start.position.., from the clean run's
residual and keys/values, with the swap terms of the senders below given. With `shared`, the first positions
that every prompt and counterfactual share run once as a key/value cache (the sweep).

Gradients: with `probe=True` a zero tensor requiring grad is added to every receiver's input, so
d metric / d probe = d metric / d x_r for each receiver separately (EAP uses the cheaper `gradients.py`; the two
agree, tested).

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
from arithmech.circuits.replicas import GroupReplicas, skipped_input
from arithmech.circuits.senders import SenderOutputs, check_edge_graph, head_outputs, mlp_sender, scaled_z
from arithmech.circuits.swaps import SwapTerms
from arithmech.models.hooks import PostHook, PreHook, first_tensor, hooks
from arithmech.models.view import ModelView


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
    """State of one patched forward pass; batch = circuit x prompt (circuit-major)."""

    view: ModelView
    graph: CircuitGraph
    ablated: SenderOutputs
    end: torch.Tensor
    batch: int
    replicas: GroupReplicas
    probe: bool
    needs_swaps: bool
    swaps: SwapTerms
    """out(ablated) - out(run) of the senders so far, and the receiver inputs they give."""
    normed_base: torch.Tensor | None = None
    """[batch, pos, d_model] the normed input that every head input of the current layer shares by default."""
    own_projections: dict[str, dict[int, list[tuple[list[int], torch.Tensor]]]] = field(default_factory=dict)
    """role -> head (query head for q, within the layer) -> for the circuits where its input differs, its
    projection there from `normed_start` on [circuits, prompt, pos - normed_start, d_head], bias not added."""
    normed_start: int = 0
    probes: list[torch.Tensor] = field(default_factory=list)
    end_resid: torch.Tensor | None = None

    def receiver_input(self, receivers: slice, resid: torch.Tensor) -> torch.Tensor:
        """[receivers, batch, pos, d_model]: resid plus the swap terms of the edges outside the circuit."""
        n = receivers.stop - receivers.start
        if self.needs_swaps:
            x = self.swaps.receiver_inputs(receivers, resid[: self.batch])
        else:
            x = resid[: self.batch][None].expand(n, -1, -1, -1)
        if self.probe:
            probe = torch.zeros_like(x, requires_grad=True)
            self.probes.append(probe)
            x = x + probe
        return x

    def late(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """x from the first position with swap terms on (`SwapTerms.start`) along `dim`; a mean's one position stays."""
        start = self.swaps.start
        return x if x.shape[dim] == 1 or start == 0 else x.narrow(dim, start, x.shape[dim] - start)

    def add_terms(self, start: int, run_out: torch.Tensor, ablated_out: torch.Tensor) -> None:
        """Swap terms of the senders from `start`: run_out [s, batch, pos, d_model], ablated_out [s, prompt, ...]
        (the same for every circuit; one row for a mean); after the first, from `SwapTerms.start` on."""
        if self.needs_swaps:
            assert start == self.swaps.count, "swap terms come in sender order"
            per_circuit = run_out.reshape(run_out.shape[0], self.swaps.circuits, -1, *run_out.shape[2:])
            self.swaps.add((ablated_out[:, None] - per_circuit).flatten(1, 2))

    # -- hooks --------------------------------------------------------------------------------------------
    def attn_inputs(self, layer: int) -> PreHook:
        norm = self.view.attn_norm(layer)

        def fn(_module: nn.Module, args: tuple[Any, ...]) -> None:
            resid = args[0][: self.batch]
            if layer == 0:
                self.add_terms(0, resid[None], self.ablated.embed[None])
            heads = self.graph.layer_receivers(layer)
            receivers = slice(heads.start, heads.stop - 1)
            self.own_projections, weights = {}, projection_weights(self.view, layer)
            if self.probe:  # every receiver its own input, with its probe
                x = norm.forward(self.receiver_input(receivers, resid))  # [3H, batch, pos, d_model]
                self.normed_base, self.normed_start = x[0], 0
                circuits = list(range(self.swaps.circuits))
                self.project_own(weights, range(len(x)), circuits, x.reshape(len(x), len(circuits), -1, *x.shape[2:]))
                return
            base, deviations = self.swaps.split(receivers, resid) if self.needs_swaps else (resid, iter(()))
            self.normed_base = norm.forward(base)  # forward: not through this hook again
            self.normed_start = self.swaps.start
            late = self.swaps.per_circuit(base)[:, :, self.normed_start :]  # [circuit, prompt, pos', d_model]
            for dev in deviations:  # one circuit at a time: only its inputs are ever held at d_model width
                x = late[dev.circuit][None] + dev.delta.reshape(-1, *late.shape[1:])  # [deviating, prompt, ..]
                rows, circuit = dev.rows.tolist(), dev.circuit
                del dev  # its delta, before the norm's temporaries
                self.project_own(weights, rows, [circuit], norm.forward(x)[:, None])
                del x

        return fn

    def project_own(
        self, weights: dict[str, tuple[torch.Tensor, torch.Tensor | None]], rows: Sequence[int], circuits: list[int],
        normed: torch.Tensor,
    ) -> None:  # fmt: skip
        """Keep the projections of receivers `rows` (within the layer: q heads, then k, then v) in `circuits`, from
        their normed inputs [row, circuit, prompt, pos', d_model]: a head's d_head outputs, not its d_model input.
        Query head h reads its W_Q block, keys and values the W_K, W_V block of h's kv group."""
        n, g = self.view.dims.n_heads, self.replicas.replicas
        for x, r in zip(normed, rows, strict=True):
            role = ROLES[r // n]
            head = r % n
            w = weights[role][0][head if role == "q" else head // g]
            y = torch.einsum("cbpm,em->cbpe", x.to(w.dtype), w)  # [circuits, prompt, pos', d_head]
            self.own_projections.setdefault(role, {}).setdefault(head, []).append((circuits, y))

    def projections(self, layer: int) -> dict[str, torch.Tensor]:
        """Module-layout outputs [replicas * batch, pos, n, d_head] of q, k and v: every head's from the shared
        normed input, then the receivers with their own input overwritten (query head h = k g + j reads the
        keys and values of kv head k in replica j)."""
        g, circuits = self.replicas.replicas, self.swaps.circuits
        out = {}
        for role, (w, b) in projection_weights(self.view, layer).items():
            y = torch.einsum("bpm,nem->bpne", self.normed_base.to(w.dtype), w)  # [batch, pos, n, d_head]
            y = y if b is None else y + b
            own = self.own_projections.get(role, {})
            if not own:
                out[role] = y[None].expand(g, *y.shape).reshape(-1, *y.shape[1:])
                continue
            y = y[None].repeat(g, 1, 1, 1, 1).reshape(g, circuits, -1, *y.shape[1:])  # [g, circuit, prompt, pos, n, e]
            for head, pieces in own.items():
                slot = head if role == "q" else head // g
                for cs, yh in pieces:
                    y[head % g, cs, :, self.normed_start :, slot] = yh if b is None else yh + b[slot]
            out[role] = y.reshape(-1, *y.shape[3:])  # [replicas * batch, pos, n, d_head]
        self.own_projections = {}
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

    def head_outputs(self, layer: int) -> PreHook:
        g = self.replicas.replicas

        def fn(_module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...] | None:
            z = self.replicas.heads_from_replicas(args[0])  # [batch, pos, head * d_head]
            if self.needs_swaps:  # heads' outputs from the first position with swap terms on
                run_z = scaled_z(self.view, layer, self.late(z, 1))
                run_out = head_outputs(self.view, layer, run_z).permute(2, 0, 1, 3)  # [head, batch, pos', d]
                ablated = head_outputs(self.view, layer, self.late(self.ablated.z[layer], 1)).permute(2, 0, 1, 3)
                self.add_terms(self.graph.head_sender(layer, 0), run_out, ablated)
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
            if self.needs_swaps:
                ablated = self.late(self.ablated.mlp_out[layer], 1)[None]
                self.add_terms(self.graph.mlp_sender(layer), self.late(out, 1)[None], ablated)

        return fn

    def logits_input(self, _module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        r = self.graph.logits_receiver
        x = self.receiver_input(slice(r, r + 1), args[0])[0]  # [batch, pos, d_model]
        self.end_resid = at_end(x, self.end)
        return (x,)


def patched_end_resid(
    view: ModelView,
    graph: CircuitGraph,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: torch.Tensor,
    ablated: SenderOutputs,
    probe: bool = False,
    extra_post: Sequence[tuple[nn.Module, PostHook]] = (),
    shared: int = 0,
    start: PassStart | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The logits' input at END [batch, d_model] with circuit `keep` [receiver, sender], and the probes.

    keep: 1 = edge in the circuit, 0 = swapped for `ablated` (fractions interpolate linearly). A batch of
    circuits, keep [circuit, receiver, sender], runs every prompt under each: rows are circuit-major
    (row c * prompts + i) and the result is [circuit * prompts, d_model]. With `probe`,
    the returned probes (in order: per layer the 3H head inputs then the MLP input, last the logits) are
    leaves whose gradient is d metric / d receiver input. `extra_post` hooks (e.g. on the input embedding)
    run too. Gradients flow only when called under grad mode.

    shared: how many first positions hold the same tokens in every prompt and in the ablation's prompts
    (`shared_positions`): no edge changes anything there, so they run once, as a key/value cache, and the
    patched pass runs on the later positions only.
    `start` (no probes): begin at a later layer and position (see above); every circuit must keep all edges into
    the receivers below `start.layer`.
    """
    check_edge_graph(view)
    d = view.dims
    device = view.o_proj(0).weight.device
    swap = ((1 - keep.to(torch.float32)) * graph.valid).to(device)
    swap = swap if swap.dim() == 3 else swap[None]  # [circuit, receiver, sender]
    circuits = int(swap.shape[0])
    first, offset = (0, shared) if start is None else (start.layer, start.position)
    if start is not None:
        if bool(swap[:, : start.first_receiver].any()) or probe or shared:
            raise ValueError("a pass that starts late must keep every edge below its layer (and has no probes)")
        ablated = start.ablated(ablated)
    if circuits > 1:  # the ablated outputs stay one per prompt: each swap term broadcasts them over circuits
        input_ids, attention_mask = input_ids.repeat(circuits, 1), attention_mask.repeat(circuits, 1)
    batch = int(input_ids.shape[0])
    inputs = GroupReplicas(d, batch).shared_start(view, input_ids[0, :shared])
    input_ids, ablated = input_ids[:, shared:], ablated.positions_from(shared)  # the mask stays whole
    run = _Run(
        view=view, graph=graph, ablated=ablated, end=attention_mask.long().sum(-1) - 1 - offset, batch=batch,
        replicas=GroupReplicas(d, batch), probe=probe, needs_swaps=bool(swap.any()), swaps=SwapTerms(graph, swap),
    )  # fmt: skip
    if start is not None and run.needs_swaps:  # the senders below start.layer: one term per prompt, for every circuit
        for first_sender, term in start.terms:
            run.add_terms(first_sender, term.new_zeros(()).expand(term.shape[0], batch, *term.shape[2:]), term)
    pre: list[tuple[nn.Module, PreHook]] = [(view.final_norm, run.logits_input)]
    post: list[tuple[nn.Module, PostHook]] = list(extra_post)
    for layer in range(first, d.n_layers):
        pre += [
            (view.attn_norm(layer), run.attn_inputs(layer)),
            (view.o_proj(layer), run.head_outputs(layer)),
            (view.mlp_norm(layer), run.mlp_input(layer)),
        ]
        projections = run.projection_hooks(layer)
        pre += [(module, skipped_input) for module, _ in projections]  # their output is replaced
        post += [*projections, (mlp_sender(view, layer), run.mlp_output(layer))]
    ids, mask = input_ids.to(device), attention_mask.to(device)
    layers = range(first, d.n_layers)
    tiled = run.replicas.replicas > 1
    replicas = [(view.attn(layer), run.replicas.attention_inputs) for layer in layers] if tiled else []
    with hooks(pre=pre, post=post, pre_kwargs=replicas):
        if start is None:
            view.model.base_model(input_ids=ids, attention_mask=mask, **inputs)
        else:
            start.run(view, circuits)
    assert run.end_resid is not None
    return run.end_resid, run.probes
