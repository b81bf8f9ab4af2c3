"""Log-probability increase (LI): how much one FFN neuron or one attention layer raises a token at END.

Background
    Yu & Ananiadou (2024) measure a vector v that a component adds to the residual x by the change in the
    log-probability of a token w when x alone and x + v are read out through the final norm and the
    unembedding, with the norm's scale held at the ORIGINAL run's final residual at END (see `models/readout.py`):

        LI(x -> v) = log softmax(W_U norm(x + v))[w] - log softmax(W_U norm(x))[w]          (METHODS.md sec. 6)

    w is the model's own prediction at END (its top token), or a given token per row.

Sites, at each row's END position
    FFN neuron k of layer l   x = the residual the MLP reads (the input of its pre-MLP norm: after attention
                              of layer l, or the block input for GPT-NeoX's parallel residual),
                              v = m_lk * W_down[:, k] (no bias; `coefficients.py`).
                              Gemma 2/3 norm the MLP output before the add; there v = p * m_lk W_down[:, k] / t
                              with p the post-norm gain and t the MLP output's own scale at END (held fixed
                              like the final norm's), so the neurons' v sum to exactly what the MLP adds.
    attention layer l         x = the residual entering the block, v = the attention output as it is added
                              (after Gemma's post-attention norm; o_proj bias included).

Vectorised and exact
    With the scale s fixed, the logits of x + m_k d_k are  L0 + (m_k / s) U_k  with L0 = W_U norm(x) + b_U and
    U_k = W_U (g * c(d_k)), one vector per neuron and no per-row work. The soft-cap and the log-softmax
    normaliser are not linear, so they are computed exactly on the full [row, neuron, d_vocab] logits, in
    chunks of neurons of at most `max_elements` numbers; nothing is approximated.

Shapes
    neuron_li(view, batch, layers)      [row, layer, d_mlp]
    attention_li(view, batch, layers)   [row, layer]
    end_states(view, batch, layers)     EndStates (the residuals, coefficients and outputs read at END)

Usage
    >>> li = neuron_li(handle.view, batch, layers=range(20, 30))     # [row, 10, d_mlp]
    >>> li.mean(0).flatten().topk(20)                                # the neurons that raise the prediction

References: Yu & Ananiadou, EMNLP 2024 (arXiv 2409.14144), sec. 2-3; METHODS.md sec. 6.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from arithmech.errors import ConfigError
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.readout import FixedNorm, cap, compute_dtype, final_norm, log_probs, unembed_weight
from arithmech.models.view import ModelView
from arithmech.neurons.coefficients import value_vectors

DEFAULT_MAX_ELEMENTS = 2**25
"""Largest [row, neuron, d_vocab] block of logits built at once (128 MiB in float32)."""


class EndBatch(Protocol):
    """Right-padded prompts: PatchingBatch and TokenizedPairs both fit."""

    ref_ids: torch.Tensor  # [row, pos]
    ref_mask: torch.Tensor  # [row, pos]
    end: torch.Tensor  # [row]


@dataclass(frozen=True)
class EndStates:
    """What one forward pass shows at each row's END, for the layers asked (index i = layers[i])."""

    layers: tuple[int, ...]
    final: torch.Tensor  # [row, d_model] residual entering the final norm
    block_in: torch.Tensor  # [row, layer, d_model] residual entering each block
    attn_added: torch.Tensor  # [row, layer, d_model] attention output as added to the residual
    mlp_in: torch.Tensor  # [row, layer, d_model] residual the MLP reads
    coeff: torch.Tensor  # [row, layer, d_mlp] neuron activation coefficients m
    mlp_out: torch.Tensor  # [row, layer, d_model] MLP module output (before any post-MLP norm)

    def __len__(self) -> int:
        return int(self.final.shape[0])


@torch.no_grad()
def end_states(view: ModelView, batch: EndBatch, layers: Sequence[int]) -> EndStates:
    """Run `batch` once (with any hooks already active) and read every site of `layers` at END."""
    layers = _check(view, batch, layers)
    dtype = compute_dtype(view)
    rows = torch.arange(len(batch.end))
    found: dict[tuple[str, int], torch.Tensor] = {}

    def at_end(t: torch.Tensor) -> torch.Tensor:
        return t[rows.to(t.device), batch.end.to(t.device)].detach().to(dtype)  # [row, width]

    def read_input(key: tuple[str, int]) -> Any:
        return lambda _m, args: found.__setitem__(key, at_end(args[0]))

    def read_output(key: tuple[str, int]) -> Any:
        return lambda _m, _args, out: found.__setitem__(key, at_end(first_tensor(out)))

    pre: list[tuple[nn.Module, Any]] = [(view.final_norm, read_input(("final", 0)))]
    post: list[tuple[nn.Module, Any]] = []
    for i, layer in enumerate(layers):
        pre += [
            (view.attn_norm(layer), read_input(("block_in", i))),
            (view.mlp_norm(layer), read_input(("mlp_in", i))),
            (view.down_proj(layer), read_input(("coeff", i))),
        ]
        post += [(view.attn(layer), read_output(("attn", i))), (view.mlp(layer), read_output(("mlp_out", i)))]
    width = int(batch.end.max()) + 1
    device = view.o_proj(0).weight.device
    with hooks(pre=pre, post=post):
        view.model.base_model(
            input_ids=batch.ref_ids[:, :width].to(device),
            attention_mask=batch.ref_mask[:, :width].to(device),
            use_cache=False,
        )

    def stack(name: str) -> torch.Tensor:
        return torch.stack([found[(name, i)] for i in range(len(layers))], dim=1)  # [row, layer, width]

    attn_added = torch.stack(
        [view.attn_resid(layer, found[("attn", i)].to(view.o_proj(layer).weight.dtype)).to(dtype)
         for i, layer in enumerate(layers)], dim=1,
    )  # fmt: skip
    return EndStates(
        layers, found[("final", 0)], stack("block_in"), attn_added, stack("mlp_in"), stack("coeff"), stack("mlp_out")
    )


def predictions(view: ModelView, states: EndStates) -> torch.Tensor:
    """The model's top token at END [row], read from the final residual through the real final norm."""
    with torch.no_grad():
        normed = view.normed(states.final)  # float32 (float64 for a float64 model), as `compute_dtype`
    return log_probs(view, normed.to(states.final.dtype)).argmax(-1).cpu()


@dataclass(frozen=True)
class Scales:
    """The fixed divisors of one run: the final norm's, and each post-MLP norm's (1 without one)."""

    final: torch.Tensor  # [row]
    mlp_post: torch.Tensor  # [row, layer]


def run_scales(view: ModelView, states: EndStates) -> Scales:
    """The scales of the run `states` came from, to hold fixed in LI."""
    final = final_norm(view).scale(states.final)
    post = torch.ones(states.mlp_out.shape[:2], dtype=states.final.dtype)
    for i, layer in enumerate(states.layers):
        norm = _post_mlp_norm(view, layer)
        if norm is not None:
            post[:, i] = norm.scale(states.mlp_out[:, i]).cpu()
    return Scales(final, post.to(final.device))


def neuron_li_from_states(
    view: ModelView,
    states: EndStates,
    target: torch.Tensor,
    scales: Scales,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> torch.Tensor:
    """LI [row, layer, d_mlp] of every neuron of `states.layers`, with the scales held at `scales`."""
    return neuron_li_of_runs(view, [states], target, scales, max_elements)[0]


@torch.no_grad()
def neuron_li_of_runs(
    view: ModelView,
    runs: Sequence[EndStates],
    target: torch.Tensor,
    scales: Scales,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> list[torch.Tensor]:
    """`neuron_li_from_states` of several runs of the same prompts and layers (e.g. intact and ablated),
    sharing the per-neuron readout W_U U_k, which costs d_mlp x d_model x d_vocab per layer."""
    norm = final_norm(view)
    w_u, b_u = unembed_weight(view, norm.gain.dtype)
    device = w_u.device
    target = target.to(device)
    n_rows = len(runs[0])
    rows = torch.arange(n_rows, device=device)
    s = scales.final.to(device)  # [row]
    out: list[list[torch.Tensor]] = [[] for _ in runs]
    chunk = max(1, max_elements // (n_rows * w_u.shape[0]))
    for i, layer in enumerate(runs[0].layers):
        directions = neuron_directions(view, layer, norm)  # [d_mlp, d_model]
        bases, base_lps, coeffs = [], [], []
        for states in runs:
            x = states.mlp_in[:, i].to(device)  # [row, d_model]
            base = norm.apply(x, s) @ w_u.T + (0 if b_u is None else b_u)  # [row, d_vocab] before the soft-cap
            bases.append(base)
            base_lps.append(cap(view, base).log_softmax(-1)[rows, target])  # [row]
            coeffs.append(states.coeff[:, i].to(device) / (s * scales.mlp_post[:, i].to(device))[:, None])
        lis = [torch.empty_like(a) for a in coeffs]  # each [row, d_mlp]
        for start in range(0, directions.shape[0], chunk):
            u = directions[start : start + chunk] @ w_u.T  # [chunk, d_vocab]
            for base, base_lp, a, li in zip(bases, base_lps, coeffs, lis, strict=True):
                logits = base[:, None, :] + a[:, start : start + chunk, None] * u[None]  # [row, chunk, d_vocab]
                lp = cap(view, logits).log_softmax(-1)  # [row, chunk, d_vocab]
                li[:, start : start + chunk] = lp[rows, :, target] - base_lp[:, None]
        for j, li in enumerate(lis):
            out[j].append(li.cpu())
    return [torch.stack(layers, dim=1) for layers in out]  # each [row, layer, d_mlp]


def neuron_directions(view: ModelView, layer: int, norm: FixedNorm | None = None) -> torch.Tensor:
    """[d_mlp, d_model]: g * c(p * W_down[:, k]) per neuron k, the readout direction of its value vector
    (p = the post-MLP norm's gain, or 1), before division by the fixed scales."""
    norm = final_norm(view) if norm is None else norm
    values = value_vectors(view, layer).detach().to(norm.gain.device, norm.gain.dtype)  # [d_mlp, d_model]
    post = _post_mlp_norm(view, layer)
    if post is not None:
        values = values * post.gain.to(values.device)
    return norm.gain * norm.center_of(values)


@torch.no_grad()
def attention_li_from_states(view: ModelView, states: EndStates, target: torch.Tensor, scales: Scales) -> torch.Tensor:
    """LI [row, layer] of each attention layer's added output, with the final scale held at `scales`."""
    norm = final_norm(view)
    s = scales.final.to(norm.gain.device)[:, None]  # [row, 1]: one scale per row, shared by the layers
    x = states.block_in.to(norm.gain.device)  # [row, layer, d_model]
    v = states.attn_added.to(norm.gain.device)
    with_v = log_probs(view, norm.apply(x + v, s))  # [row, layer, d_vocab]
    without = log_probs(view, norm.apply(x, s))
    index = target.to(with_v.device)[:, None, None].expand(-1, x.shape[1], 1)  # [row, layer, 1]
    return (with_v.gather(-1, index) - without.gather(-1, index))[..., 0].cpu()


@torch.no_grad()
def neuron_li(
    view: ModelView,
    batch: EndBatch,
    layers: Sequence[int],
    target: torch.Tensor | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> torch.Tensor:
    """LI [row, layer, d_mlp] of every FFN neuron of `layers` at END, for the model's prediction or `target`."""
    states = end_states(view, batch, layers)
    w = predictions(view, states) if target is None else check_target(view, target, len(states))
    return neuron_li_from_states(view, states, w, run_scales(view, states), max_elements)


@torch.no_grad()
def attention_li(
    view: ModelView, batch: EndBatch, layers: Sequence[int], target: torch.Tensor | None = None
) -> torch.Tensor:
    """LI [row, layer] of the attention output of each of `layers` at END, for the prediction or `target`."""
    states = end_states(view, batch, layers)
    w = predictions(view, states) if target is None else check_target(view, target, len(states))
    return attention_li_from_states(view, states, w, run_scales(view, states))


# -- internals ----------------------------------------------------------------------------------------------
def _post_mlp_norm(view: ModelView, layer: int) -> FixedNorm | None:
    module = view.mlp_out_norm(layer)
    return None if module is None else FixedNorm.of(module, view.dims.d_model, compute_dtype(view))


def _check(view: ModelView, batch: EndBatch, layers: Sequence[int]) -> tuple[int, ...]:
    layers = tuple(int(layer) for layer in layers)
    n = view.dims.n_layers
    if not layers or any(not 0 <= layer < n for layer in layers):
        raise ConfigError(f"layers must be a non-empty list in 0..{n - 1}; got {list(layers)}")
    if len(batch.end) == 0:
        raise ConfigError("the prompt batch is empty; give at least one prompt")
    return layers


def check_target(view: ModelView, target: torch.Tensor, rows: int) -> torch.Tensor:
    target = torch.as_tensor(target, dtype=torch.long).flatten()
    if target.shape != (rows,) or int(target.min()) < 0 or int(target.max()) >= view.dims.d_vocab:
        raise ConfigError(f"target must hold one token id in 0..{view.dims.d_vocab - 1} per prompt ({rows})")
    return target
