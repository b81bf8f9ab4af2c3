"""A norm with its scale held fixed, and the vocabulary readout through it.

Background
    Yu & Ananiadou (2024) score a vector v added to a residual x by how much it raises the log-probability of
    a token when read out through the final norm and the unembedding. The norm divides by the residual's own
    scale, which would make the readout depend on every other vector in the residual; they hold the scale
    fixed at the ORIGINAL run's value, which makes the norm an affine map and the readout of a sum the sum of
    readouts before the softmax.

Formula
    An RMSNorm is  norm(x) = g * x / sqrt(mean(x^2) + eps)  (g = weight, or 1 + weight for Gemma), a
    LayerNorm  norm(x) = g * (x - mean(x)) / sqrt(var(x) + eps) + b.  With s the scale of a reference
    vector x0 (one per row):

        fixed(y; s) = g * c(y) / s + b                    c(y) = y - mean(y) (LayerNorm) or y (RMSNorm)

    Mean-centering is linear, so it stays part of the map for LayerNorm; only the division by the scale is
    frozen. fixed(x0; s(x0)) = norm(x0) exactly, and fixed(x + v; s) = fixed(x; s) + g * c(v) / s.
    The readout is  logits(y) = softcap(W_U fixed(y; s) + b_U)  with the model's soft-cap, if any.

    The effective gain g is probed, not assumed: for an RMS norm, g = norm(1) * sqrt(1 + eps), which covers
    both the `weight` and the `1 + weight` conventions; `FixedNorm.of` checks the reconstruction on a random
    vector and raises SpecError for a norm that is neither kind.

Usage
    >>> norm = FixedNorm.of(view.final_norm, view.dims.d_model, torch.float32)
    >>> s = norm.scale(final_resid_end)                       # [row]
    >>> logp = log_probs(view, norm.apply(x + v, s))          # [row, d_vocab]

References: Yu & Ananiadou, EMNLP 2024 (arXiv 2409.14144), sec. 2 (log probability increase); METHODS.md sec. 6.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from arithmech.errors import SpecError
from arithmech.models.view import ModelView, forward_in_dtype


@dataclass(frozen=True)
class FixedNorm:
    """A LayerNorm or RMSNorm as the affine map it is once its scale is held fixed."""

    center: bool
    """Subtract the mean first (LayerNorm)."""
    gain: torch.Tensor  # [d_model], effective multiplier (1 + weight for Gemma)
    bias: torch.Tensor | None  # [d_model]
    eps: float

    @classmethod
    def of(cls, module: nn.Module, d_model: int, dtype: torch.dtype) -> FixedNorm:
        """Read a norm module's gain, bias and eps (computed in `dtype`, on the module's device)."""
        weight = getattr(module, "weight", None)
        eps = getattr(module, "eps", None)
        eps = getattr(module, "variance_epsilon", None) if eps is None else eps
        if weight is None or eps is None:
            raise SpecError(
                f"the norm {type(module).__name__} has no weight or eps; the fixed-scale readout supports "
                "LayerNorm and RMSNorm only"
            )
        device = weight.device
        if isinstance(module, nn.LayerNorm):
            bias = None if module.bias is None else module.bias.detach().to(dtype)
            norm = cls(True, weight.detach().to(dtype), bias, float(eps))
        else:
            with torch.no_grad():
                ones = torch.ones(1, d_model, dtype=dtype, device=device)
                gain = forward_in_dtype(module, ones, dtype)[0] * (1.0 + float(eps)) ** 0.5  # [d_model]
            norm = cls(False, gain, None, float(eps))
        norm._verify(module, d_model, dtype, device)
        return norm

    def _verify(self, module: nn.Module, d_model: int, dtype: torch.dtype, device: torch.device) -> None:
        """Raise SpecError if the module is not the norm this object describes."""
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(2, d_model, generator=gen, dtype=torch.float64).to(device, dtype) * 3 + 0.5
        with torch.no_grad():
            expected = forward_in_dtype(module, x, dtype)  # a bfloat16 module, read in float32 as the readout is
        got = self.apply(x, self.scale(x))
        if not torch.allclose(got, expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max())):
            raise SpecError(
                f"the norm {type(module).__name__} is neither a LayerNorm nor an RMSNorm; the fixed-scale "
                "readout cannot represent it"
            )

    def center_of(self, y: torch.Tensor) -> torch.Tensor:
        """c(y): y minus its mean over d_model for LayerNorm, y itself for RMSNorm."""
        return y - y.mean(-1, keepdim=True) if self.center else y

    def scale(self, x0: torch.Tensor) -> torch.Tensor:
        """The norm's divisor for reference vectors x0 [..., d_model] -> [...]."""
        c = self.center_of(x0.to(self.gain.dtype))
        return (c.pow(2).mean(-1) + self.eps).sqrt()

    def linear(self, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """g * c(y) / s without the bias: the part of the fixed norm that is linear in y [..., d_model]."""
        return self.gain * self.center_of(y.to(self.gain.dtype)) / s[..., None]

    def apply(self, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """fixed(y; s) = g * c(y) / s + b, with y [..., d_model] and s [...] broadcast over d_model."""
        out = self.linear(y, s)
        return out + self.bias if self.bias is not None else out


def compute_dtype(view: ModelView) -> torch.dtype:
    """float32 for half-precision and float32 models, float64 for float64 models."""
    return torch.promote_types(view.o_proj(0).weight.dtype, torch.float32)


def final_norm(view: ModelView) -> FixedNorm:
    """The model's final norm as a FixedNorm, in `compute_dtype(view)`."""
    return FixedNorm.of(view.final_norm, view.dims.d_model, compute_dtype(view))


def unembed_weight(view: ModelView, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W_U [d_vocab, d_model], b_U [d_vocab] or None) in `dtype`."""
    bias = getattr(view.unembed, "bias", None)
    return view.unembed.weight.detach().to(dtype), None if bias is None else bias.detach().to(dtype)


def cap(view: ModelView, logits: torch.Tensor) -> torch.Tensor:
    """The model's final logit soft-cap tanh(x / c) * c, or the logits unchanged."""
    c = view.logit_softcap
    return torch.tanh(logits / c) * c if c is not None else logits


def log_probs(view: ModelView, normed: torch.Tensor) -> torch.Tensor:
    """log softmax(softcap(W_U normed + b_U)) over the vocabulary: [..., d_model] -> [..., d_vocab]."""
    w_u, b_u = unembed_weight(view, normed.dtype)
    logits = normed.to(w_u.device) @ w_u.T
    return cap(view, logits if b_u is None else logits + b_u).log_softmax(-1)
