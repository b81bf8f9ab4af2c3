"""The plain reference for edge circuits: every receiver's input rebuilt sender by sender, one forward per circuit.

Written to be obviously right rather than fast, and independent of `arithmech.circuits.patched`:
- sender outputs are per-head slices of z times the o_proj weight slice (`head_weight_slices`), one head at a time;
  under Gemma's post-attention norm, gain * x / rms(a) with the layer's attention output a = sum of the heads' x
  written out from Gemma's RMSNorm formula (gain = 1 + weight); an MLP's output is its post-MLP norm's output;
- a receiver's input is the constant o_proj biases of the layers it reads plus, for every sender before it,
  keep * (output in this run) + (1 - keep) * (ablated output) [+ shift * (clean output - cf output)];
- attention is run once per query head with that head's own q, k and v inputs (the module's own projections on
  the whole normed input; the head's slice of z is kept), so grouped-query attention needs no replicas.
`keep` and `shift` may require grad: d m / d shift[r, s] at shift = 0 is the edge's gradient-times-difference.
"""

from __future__ import annotations

from typing import Any

import torch

from arithmech.circuits.batch import CircuitBatch
from arithmech.circuits.graph import ROLES, CircuitGraph
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.view import ModelView

from tiny_models import TINY_ARCHS, make_tiny_model

ARCHS = list(TINY_ARCHS)


def tiny_view(arch: str) -> ModelView:
    model = make_tiny_model(arch)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def tiny_batch(seed: int = 0) -> CircuitBatch:
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(40, 120, (3, 7), generator=gen)
    cf = torch.randint(40, 120, (3, 7), generator=gen)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0  # a shorter prompt, right-padded
    return CircuitBatch(clean, cf, mask, torch.tensor([50, 51, 52]), torch.tensor([53, 54, 55]))


def shared_start_batch(shared: int = 3) -> CircuitBatch:
    """`tiny_batch` whose clean and counterfactual prompts all start with the same `shared` tokens."""
    base = tiny_batch()
    start = torch.arange(60, 60 + shared)[None].expand(len(base), -1)
    return CircuitBatch(
        torch.cat([start, base.clean_ids[:, shared:]], 1), torch.cat([start, base.cf_ids[:, shared:]], 1), base.mask,
        base.answer_ids, base.cf_answer_ids,
    )  # fmt: skip


def random_circuit(graph: CircuitGraph, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(graph.n_receivers, graph.n_senders, generator=gen) < 0.5).float() * graph.valid


def _head_out(view: ModelView, layer: int, head: int, z: torch.Tensor) -> torch.Tensor:
    """One head's output [batch, pos, d_model] from the o_proj input z [batch, pos, head * d_head]."""
    o = view.head_weight_slices(layer, head)["o"]
    z_h = z[..., o.index]
    w = o.weight()  # Linear: [d_model, d_head]; Conv1D: [d_head, d_model]
    return z_h @ w if view.spec.conv1d else z_h @ w.T


def _shares(view: ModelView, layer: int, outs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The heads' outputs `outs` as the residual receives them: unchanged, or their shares of the normed sum."""
    norm = view.attn_out_norm(layer)
    if norm is None:
        return outs
    a = sum(outs)
    r = torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + norm.eps)
    return [o * r * (1 + norm.weight) for o in outs]


def _mlp_sender(view: ModelView, layer: int) -> Any:
    norm = view.mlp_out_norm(layer)
    return view.mlp(layer) if norm is None else norm


def _o_bias(view: ModelView, layer: int) -> torch.Tensor | float:
    b = getattr(view.o_proj(layer), "bias", None)
    return 0.0 if b is None else b


def sender_outputs(view: ModelView, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Every sender's output [batch, pos, d_model] of a plain run, in sender order."""
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    outs: list[Any] = [None] * graph.n_senders

    def at(index: int, fn: Any) -> Any:
        def hook(_m: Any, *rest: Any) -> None:
            outs[index] = fn(*rest)

        return hook

    pre = [(view.attn_norm(0), at(0, lambda args: args[0].detach()))]
    post = []
    for layer in range(view.dims.n_layers):

        def heads(args: tuple[Any, ...], layer: int = layer) -> None:
            raw = [_head_out(view, layer, h, args[0].detach()) for h in range(view.dims.n_heads)]
            for h, out in enumerate(_shares(view, layer, raw)):
                outs[graph.head_sender(layer, h)] = out

        pre.append((view.o_proj(layer), lambda _m, args, f=heads: f(args)))
        post.append((_mlp_sender(view, layer), at(graph.mlp_sender(layer), lambda _a, out: first_tensor(out).detach())))
    with torch.no_grad(), hooks(pre=pre, post=post):
        view.model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
    return outs


def mean_outputs(outs: list[torch.Tensor], mask: torch.Tensor) -> list[torch.Tensor]:
    """Each output averaged over prompts and real positions, [1, 1, d_model]."""
    w = (mask / mask.sum()).to(outs[0].dtype)[..., None]
    return [(o * w).sum(dim=(0, 1), keepdim=True) for o in outs]


def naive_end_resid(
    view: ModelView,
    ids: torch.Tensor,
    mask: torch.Tensor,
    keep: torch.Tensor,
    ablated: list[torch.Tensor],
    shift: torch.Tensor | None = None,
    shift_by: list[torch.Tensor] | None = None,
    embed_alpha: float | None = None,
    cf_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logits' input at END [batch, d_model] of the circuit `keep` [receiver, sender], sender by sender."""
    graph = CircuitGraph.from_dims(view.dims, view.parallel_residual)
    d = view.dims
    outs: list[Any] = [None] * graph.n_senders
    state: dict[str, Any] = {"current": None}
    end = mask.sum(-1) - 1

    def rebuilt(receiver: int, const: Any) -> torch.Tensor:
        x = const
        for s in range(graph.senders_before(receiver)):
            k = keep[receiver, s]
            x = x + k * outs[s] + (1 - k) * ablated[s]
            if shift is not None and shift_by is not None:
                x = x + shift[receiver, s] * shift_by[s]
        return x

    def bias_below(layer: int) -> Any:
        return sum((_o_bias(view, lw) for lw in range(layer)), 0.0)

    def embed_in(_m: Any, args: tuple[Any, ...]) -> None:
        outs[0] = args[0]

    def capture_call(layer: int) -> Any:
        def fn(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            state[f"call{layer}"] = (args, kwargs)

        return fn

    def proj_hook(role: str, fused_index: Any = None) -> Any:
        def fn(module: Any, _args: Any, output: Any) -> Any:
            if state["current"] is None:
                return None
            normed = state["current"]["normed"]
            if fused_index is None:
                return module.forward(normed[role])
            out = output.clone()
            for r in ROLES:
                idx = state["current"]["slices"][r].index
                out[..., idx] = module.forward(normed[r])[..., idx]
            return out

        return fn

    def z_hook(_m: Any, args: tuple[Any, ...]) -> None:
        if state["current"] is not None:
            state["current"]["z"] = args[0]

    def attention(layer: int) -> Any:
        norm = view.attn_norm(layer)

        def fn(module: Any, _args: Any, output: Any) -> Any:
            args, kwargs = state[f"call{layer}"]
            raw = []
            for h in range(d.n_heads):
                normed = {r: norm.forward(rebuilt(graph.head_receiver(layer, r, h), bias_below(layer))) for r in ROLES}
                state["current"] = {"normed": normed, "slices": view.head_weight_slices(layer, h)}
                module.forward(*args, **kwargs)
                raw.append(_head_out(view, layer, h, state["current"]["z"]))
                state["current"] = None
            for h, out in enumerate(_shares(view, layer, raw)):
                outs[graph.head_sender(layer, h)] = out
            attn_out = _o_bias(view, layer) + sum(raw)
            return (attn_out, *output[1:]) if isinstance(output, tuple) else attn_out

        return fn

    def mlp_in(layer: int) -> Any:
        def fn(_m: Any, _args: tuple[Any, ...]) -> tuple[torch.Tensor]:
            below = layer if view.parallel_residual else layer + 1
            return (rebuilt(graph.mlp_receiver(layer), bias_below(below)),)

        return fn

    def mlp_out(layer: int) -> Any:
        def fn(_m: Any, _args: Any, output: Any) -> None:
            outs[graph.mlp_sender(layer)] = first_tensor(output)

        return fn

    final: list[torch.Tensor] = []

    def logits_in(_m: Any, _args: tuple[Any, ...]) -> tuple[torch.Tensor]:
        x = rebuilt(graph.logits_receiver, bias_below(d.n_layers))
        final.append(x[torch.arange(x.shape[0]), end])
        return (x,)

    pre: list[Any] = [(view.attn_norm(0), embed_in), (view.final_norm, logits_in)]
    post: list[Any] = []
    pre_kwargs: list[Any] = []
    s = view.spec
    for layer in range(d.n_layers):
        pre += [(view.o_proj(layer), z_hook), (view.mlp_norm(layer), mlp_in(layer))]
        pre_kwargs.append((view.attn(layer), capture_call(layer)))
        post += [(view.attn(layer), attention(layer)), (_mlp_sender(view, layer), mlp_out(layer))]
        if s.qkv_layout == "separate":
            post += [
                (view.module(layer, str(p)), proj_hook(r))
                for p, r in zip((s.q_proj, s.k_proj, s.v_proj), ROLES, strict=True)
            ]
        else:
            post.append((view.module(layer, str(s.qkv_proj)), proj_hook("qkv", fused_index=True)))
    if embed_alpha is not None:
        assert cf_ids is not None
        emb = view.model.get_input_embeddings()
        cf_embed = emb(cf_ids).detach()
        post.append((emb, lambda _m, _a, out: cf_embed + embed_alpha * (out - cf_embed)))
    with hooks(pre=pre, post=post, pre_kwargs=pre_kwargs):
        view.model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
    return final[0]
