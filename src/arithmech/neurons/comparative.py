"""Comparative neuron analysis (CNA): which FFN neurons lose their effect when a key head is removed.

Background
    Yu & Ananiadou (2024) find that an arithmetic head matters through the FFN neurons it drives: with the
    head zeroed, the neurons that wrote the answer lose their activation, and the answer's probability falls.
    CNA compares each neuron's log-probability increase (LI, `log_increase.py`) in the intact model with its
    LI when the head's output is zeroed:

        CNA(l, k) = LI_intact(l, k) - LI_zeroed(l, k)                                [row, layer, d_mlp]

    Both terms read the same token w (the INTACT model's prediction at END, or a given target) through the
    final norm with the same fixed scale, the INTACT run's final residual scale at END (and, for Gemma 2/3,
    the intact run's post-MLP norm scales). Holding the intact scales makes the two LIs differ only through
    what the head changes upstream of the neuron (its coefficient m and the residual x it is added to), not
    through a different normalisation of the readout. A large positive CNA marks a neuron whose contribution
    to the prediction depends on the head.

    The head is zeroed at every real position with the zero mode of `knockout/ablation.py` (its slice of the
    o_proj input set to 0, i.e. its W_O block contributes nothing). An MLP component may be given as well.

Report
    `top_neurons_report` lists the top-k neurons by CNA averaged over prompts: layer, neuron, mean coefficient
    and mean LI with and without the head, and the tokens the neuron's value vector promotes when read through
    the unembedding (the direction g * c(W_down[:, k]) of the fixed final norm, times W_U; for Gemma 2/3 also
    through the post-MLP norm gain).

Usage
    >>> cna = comparative_neurons(handle.view, batch, Component(14, 2), layers=range(15, 30))
    >>> cna.scores.mean(0)                                    # [layer, d_mlp]
    >>> for row in top_neurons_report(handle.view, handle.tokenizer, cna, k=20): ...

References: Yu & Ananiadou, EMNLP 2024 (arXiv 2409.14144), sec. 3-4 (comparative neuron analysis);
METHODS.md sec. 6.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from arithmech.errors import ConfigError
from arithmech.knockout.ablation import ablate, ablation_sources
from arithmech.models.readout import final_norm, unembed_weight
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.neurons.log_increase import (
    DEFAULT_MAX_ELEMENTS,
    EndBatch,
    check_target,
    end_states,
    neuron_directions,
    neuron_li_of_runs,
    predictions,
    run_scales,
)
from arithmech.patching.path import PatchingBatch


@dataclass(frozen=True)
class ComparativeNeurons:
    """LI and coefficients of every neuron of `layers`, with the model intact and with `component` zeroed."""

    component: Component
    layers: tuple[int, ...]
    target: torch.Tensor  # [row] the token read (the intact prediction by default)
    li_intact: torch.Tensor  # [row, layer, d_mlp]
    li_zeroed: torch.Tensor  # [row, layer, d_mlp]
    coeff_intact: torch.Tensor  # [row, layer, d_mlp]
    coeff_zeroed: torch.Tensor  # [row, layer, d_mlp]

    @property
    def scores(self) -> torch.Tensor:
        """CNA = LI_intact - LI_zeroed, [row, layer, d_mlp]."""
        return self.li_intact - self.li_zeroed

    def top(self, k: int) -> list[tuple[int, int]]:
        """(layer, neuron) of the k largest CNA scores averaged over prompts, largest first."""
        mean = self.scores.mean(0)  # [layer, d_mlp]
        if not 0 < k <= mean.numel():
            raise ConfigError(f"k must be in 1..{mean.numel()} (layers x neurons); got {k}")
        flat = mean.flatten().topk(k).indices  # index = layer index * d_mlp + neuron
        return [(self.layers[int(i) // mean.shape[1]], int(i) % mean.shape[1]) for i in flat]


@torch.no_grad()
def comparative_neurons(
    view: ModelView,
    batch: EndBatch,
    component: Component,
    layers: Sequence[int],
    target: torch.Tensor | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> ComparativeNeurons:
    """Neuron LI of `layers` with the model intact and with `component` zeroed at every position."""
    _check_component(view, component)
    intact = end_states(view, batch, layers)
    w = predictions(view, intact) if target is None else check_target(view, target, len(intact))
    scales = run_scales(view, intact)  # the intact run's scales, held for both runs
    patching = _as_patching_batch(batch)
    sources = ablation_sources(view, patching, "zero", groups=[0] * len(patching))
    with ablate(view, [component], sources):
        zeroed = end_states(view, batch, layers)
    li_intact, li_zeroed = neuron_li_of_runs(view, [intact, zeroed], w, scales, max_elements)
    return ComparativeNeurons(
        component,
        intact.layers,
        w,
        li_intact,
        li_zeroed,
        intact.coeff.float().cpu(),
        zeroed.coeff.float().cpu(),
    )


def cna_scores(
    view: ModelView,
    batch: EndBatch,
    head: Component,
    layers: Sequence[int],
    target: torch.Tensor | None = None,
) -> torch.Tensor:
    """CNA [row, layer, d_mlp] = LI(intact) - LI(with `head` zeroed), same token and same (intact) scale."""
    return comparative_neurons(view, batch, head, layers, target).scores


@dataclass(frozen=True)
class NeuronReport:
    """One top CNA neuron: where it is, how it changes without the component, and what it writes."""

    layer: int
    neuron: int
    cna: float
    """Mean CNA score over prompts."""
    coeff_intact: float
    coeff_zeroed: float
    li_intact: float
    li_zeroed: float
    top_tokens: list[str]
    """Tokens with the largest readout of the value vector (W_U g c(W_down[:, k]))."""
    promoted_tokens: list[str]
    """The same for the vector the neuron writes on average: value vector times the sign of its mean
    intact coefficient (equal to top_tokens when that is positive)."""


@torch.no_grad()
def top_neurons_report(
    view: ModelView, tokenizer: Any, result: ComparativeNeurons, k: int = 20, n_tokens: int = 10
) -> list[NeuronReport]:
    """The k top neurons by mean CNA, with their coefficients, LIs and value-vector tokens."""
    if n_tokens < 1:
        raise ConfigError(f"n_tokens must be at least 1; got {n_tokens}")
    norm = final_norm(view)
    w_u, _ = unembed_weight(view, norm.gain.dtype)
    n_tokens = min(n_tokens, int(w_u.shape[0]))
    rows = []
    mean = {name: getattr(result, name).mean(0) for name in ("coeff_intact", "coeff_zeroed", "li_intact", "li_zeroed")}
    scores = result.scores.mean(0)  # [layer, d_mlp]
    directions: dict[int, torch.Tensor] = {}
    for layer, neuron in result.top(k):
        i = result.layers.index(layer)
        if layer not in directions:
            directions[layer] = neuron_directions(view, layer, norm)  # [d_mlp, d_model]
        readout = w_u @ directions[layer][neuron].to(w_u.device)  # [d_vocab]
        sign = -1.0 if float(mean["coeff_intact"][i, neuron]) < 0 else 1.0
        rows.append(
            NeuronReport(
                layer=layer,
                neuron=neuron,
                cna=float(scores[i, neuron]),
                coeff_intact=float(mean["coeff_intact"][i, neuron]),
                coeff_zeroed=float(mean["coeff_zeroed"][i, neuron]),
                li_intact=float(mean["li_intact"][i, neuron]),
                li_zeroed=float(mean["li_zeroed"][i, neuron]),
                top_tokens=_decode(tokenizer, readout.topk(n_tokens).indices),
                promoted_tokens=_decode(tokenizer, (sign * readout).topk(n_tokens).indices),
            )
        )
    return rows


def _decode(tokenizer: Any, ids: torch.Tensor) -> list[str]:
    return [tokenizer.decode([int(i)]) for i in ids]


def _check_component(view: ModelView, component: Component) -> None:
    d = view.dims
    if not 0 <= component.layer < d.n_layers or (component.head is not None and not 0 <= component.head < d.n_heads):
        raise ConfigError(
            f"component {component} does not exist: the model has layers 0..{d.n_layers - 1} "
            f"and heads 0..{d.n_heads - 1}"
        )


def _as_patching_batch(batch: EndBatch) -> PatchingBatch:
    """The reference prompts of `batch` as a PatchingBatch (the counterfactual side is unused by zeroing)."""
    if isinstance(batch, PatchingBatch):
        return batch
    ids, mask, end = batch.ref_ids, batch.ref_mask, batch.end
    return PatchingBatch(ids, mask, ids, mask, end, torch.zeros_like(end))
