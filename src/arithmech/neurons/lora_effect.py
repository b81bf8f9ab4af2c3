"""What a LoRA adapter changes in chosen FFN neurons: their END coefficients and log-probability increases.

Background
    Yu & Ananiadou (2024) find that a LoRA adapter fine-tuned on arithmetic raises the probability of the
    correct answer by amplifying the activation coefficients of the FFN neurons related to the prediction (the
    top CNA / log-increase neurons). `coefficient_change` compares given neurons without and with an adapter:
    one trained by `lora_train.train_layer_lora` or a user's peft adapter folder (`lora_adapter.py`).
    (METHODS.md sec. 6.)

Formula
    For neurons (l, k), `coefficient_change` reports the END coefficient m_lk (`coefficients.py`) per prompt

        before [row, neuron]   base model
        after  [row, neuron]   base model + adapter

    and their means; with answer ids it also reports each neuron's log-probability increase LI (sec. 6,
    `log_increase.py`) for the answer token with and without the adapter, each read with its own run's END
    scales: s of the final norm and t of the post-MLP norm (Gemma 2/3; t = 1 otherwise). With them fixed,

        logits(x + m_lk v_lk) = L0 + (m_lk / (s t)) U_lk        U_lk = W_U d_lk   [d_vocab]

    d_lk the neuron's readout direction (`log_increase.neuron_directions`); soft-cap and log-softmax are exact.

    When the adapter changes a down projection, the "after" LI uses the adapted value vectors
    W_down + (alpha / r) B A (the adapter is merged for that pass only; the exact weights are put back).

Usage
    >>> change = coefficient_change(handle, "runs/lora-l20", ids, mask, end, [(20, 5769), (21, 12)], answers)
    >>> change.rows()                                            # mean m and LI per neuron, before and after

References: Yu & Ananiadou, EMNLP 2024 (arXiv 2409.14144), LoRA analysis; METHODS.md sec. 6.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech.errors import ConfigError
from arithmech.models.load import ModelHandle
from arithmech.models.view import ModelView
from arithmech.neurons.coefficients import end_coefficients
from arithmech.neurons.lora_adapter import LoraAdapter, applied_lora


@dataclass(frozen=True)
class CoefficientChange:
    """END coefficients (and log-probability increases) of chosen neurons without vs with an adapter."""

    neurons: tuple[tuple[int, int], ...]
    """(layer, neuron) pairs, in the column order of the tensors."""
    before: torch.Tensor  # [row, neuron]
    after: torch.Tensor  # [row, neuron]
    li_before: torch.Tensor | None = None  # [row, neuron]
    li_after: torch.Tensor | None = None  # [row, neuron]

    def rows(self) -> list[dict[str, Any]]:
        """One row per neuron: mean coefficient (and LI) before and after, their difference and ratio."""
        out = []
        mean_b, mean_a = self.before.mean(0), self.after.mean(0)
        for j, (layer, neuron) in enumerate(self.neurons):
            b, a = float(mean_b[j]), float(mean_a[j])
            row: dict[str, Any] = {
                "neuron": f"{layer}_{neuron}",
                "layer": layer,
                "index": neuron,
                "coef_before": b,
                "coef_after": a,
                "coef_change": a - b,
                "coef_ratio": a / b if b != 0 else math.nan,
            }
            if self.li_before is not None and self.li_after is not None:
                li_b, li_a = float(self.li_before[:, j].mean()), float(self.li_after[:, j].mean())
                row.update(li_before=li_b, li_after=li_a, li_change=li_a - li_b)
            out.append(row)
        return out


@torch.no_grad()
def neuron_coefficients(
    view: ModelView, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor, neurons: Sequence[tuple[int, int]]
) -> torch.Tensor:
    """END coefficients of (layer, neuron) pairs: [row, neuron], one forward pass."""
    layers = sorted({int(layer) for layer, _ in neurons})
    coef = end_coefficients(view, ids, mask, end, layers)  # [row, len(layers), d_mlp]
    width = coef.shape[-1]
    bad = [(layer, k) for layer, k in neurons if not 0 <= int(k) < width]
    if bad:
        raise ConfigError(f"neurons {bad[:3]} do not exist: neuron indices are 0..{width - 1}")
    cols = torch.tensor([[layers.index(int(layer)), int(k)] for layer, k in neurons], dtype=torch.long)
    return coef[:, cols[:, 0], cols[:, 1]]  # [row, neuron]


@torch.no_grad()
def coefficient_change(
    handle: ModelHandle,
    adapter: LoraAdapter | str | Path,
    ids: torch.Tensor,
    mask: torch.Tensor,
    end: torch.Tensor,
    neurons: Sequence[tuple[int, int]],
    answer_ids: torch.Tensor | None = None,
) -> CoefficientChange:
    """END coefficients of `neurons` on the base model and with `adapter` applied (the model is restored after).

    neurons: (layer, neuron) pairs, e.g. the top CNA neurons. With answer_ids, also each neuron's LI.
    """
    if not neurons:
        raise ConfigError("no neurons given; pass (layer, neuron) pairs such as the top CNA neurons")
    neurons = tuple((int(layer), int(k)) for layer, k in neurons)
    view = handle.view
    before = neuron_coefficients(view, ids, mask, end, neurons)
    li_before = None if answer_ids is None else _neuron_li(view, ids, mask, end, answer_ids, neurons)
    li_after = None
    with applied_lora(handle, adapter) as peft_model:
        after = neuron_coefficients(view, ids, mask, end, neurons)
        if answer_ids is not None:
            with _merged(peft_model):  # an adapted down projection changes the value vectors LI reads
                li_after = _neuron_li(view, ids, mask, end, answer_ids, neurons)
    return CoefficientChange(neurons, before, after, li_before, li_after)


@dataclass(frozen=True)
class _Prompts:
    """The right-padded prompts as the `log_increase.EndBatch` protocol."""

    ref_ids: torch.Tensor  # [row, pos]
    ref_mask: torch.Tensor  # [row, pos]
    end: torch.Tensor  # [row]


def _neuron_li(
    view: ModelView,
    ids: torch.Tensor,
    mask: torch.Tensor,
    end: torch.Tensor,
    answer_ids: torch.Tensor,
    neurons: tuple[tuple[int, int], ...],
) -> torch.Tensor:
    """LI of each (layer, neuron) for the answer token, with this run's own END scales: [row, neuron].

    `log_increase.neuron_li_from_states` for the chosen neurons only (it scores every neuron of a layer, which
    for a 49k vocabulary costs minutes on a CPU): logits(x + m_k v_k) = L0 + (m_k / (s t)) U_k, soft-cap and
    log-softmax exact.
    """
    from arithmech.models.readout import cap, final_norm, unembed_weight
    from arithmech.neurons.log_increase import end_states, neuron_directions, run_scales

    layers = sorted({layer for layer, _ in neurons})
    states = end_states(view, _Prompts(ids, mask, end), layers)
    scales = run_scales(view, states)
    norm = final_norm(view)
    w_u, b_u = unembed_weight(view, norm.gain.dtype)
    rows = torch.arange(len(end), device=w_u.device)
    target = answer_ids.to(w_u.device)
    s = scales.final.to(w_u.device)  # [row]
    out = torch.empty(len(end), len(neurons))
    for i, layer in enumerate(layers):
        cols = [j for j, (lay, _) in enumerate(neurons) if lay == layer]
        ks = torch.tensor([neurons[j][1] for j in cols], dtype=torch.long)
        base = norm.apply(states.mlp_in[:, i].to(w_u.device), s) @ w_u.T  # [row, d_vocab] before bias and cap
        base = base if b_u is None else base + b_u
        base_lp = cap(view, base).log_softmax(-1)[rows, target]  # [row]
        coef = states.coeff[:, i, ks].to(w_u.device)  # [row, neuron]
        a = coef / (s * scales.mlp_post[:, i].to(w_u.device))[:, None]  # [row, neuron]
        directions = neuron_directions(view, layer, norm)[ks.to(w_u.device)]  # [neuron, d_model]
        step = max(1, 2**25 // (len(end) * w_u.shape[0]))  # at most 2**25 logits at once
        for c in range(0, len(cols), step):
            u = directions[c : c + step] @ w_u.T  # [chunk, d_vocab]
            logits = base[:, None, :] + a[:, c : c + step, None] * u[None]  # [row, chunk, d_vocab]
            lp = cap(view, logits).log_softmax(-1)[rows, :, target]  # [row, chunk]
            out[:, cols[c : c + step]] = (lp - base_lp[:, None]).cpu().float()
    return out


@contextmanager
def _merged(peft_model: Any) -> Iterator[None]:
    """Merge the adapter into the base weights for the block; put the exact original weights back after.

    LI reads value vectors from the down projection's weight; merged, that weight is W + (alpha / r) B A.
    Unmerging subtracts in floating point, so the saved originals are copied back bit for bit.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    saved = [
        (p, p.detach().clone())
        for m in peft_model.modules()
        if isinstance(m, BaseTunerLayer)
        for p in m.get_base_layer().parameters(recurse=False)
    ]
    peft_model.merge_adapter()
    try:
        yield
    finally:
        peft_model.unmerge_adapter()
        with torch.no_grad():
            for p, original in saved:
                p.copy_(original)
