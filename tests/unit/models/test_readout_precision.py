"""The logit readout is float32 for a bfloat16 model: it matches a float64 readout of the same residual.

A bfloat16 logit near 20 moves in steps of 0.125 (8 bits of mantissa), as large as the head effects that path
patching ranks. `ModelView.answer_logits` and `end_logits` apply the final norm and the unembedding in float32
to the (bfloat16) residual entering the final norm, so they agree with float64 arithmetic on the same bfloat16
weights and residual to float32 rounding: |error| <= 1e-4 at logits of 10-64 (measured <= 7e-6), where the
bfloat16 readout (norm output, products and sum rounded to bfloat16, as before the fix) was off by up to 0.1.
The unembedding is scaled so that logits are ~20, as in a trained 7B model; for the tied GPT-2 and Gemma this
scales the input embeddings too, which is fine here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arithmech.models.archs import spec_for_model_type
from arithmech.models.view import ModelView
from arithmech.patching.states import collect_end_states

from tiny_models import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

TOLERANCE = 1e-4
"""Largest |float32 readout - float64 readout| allowed at logits of ~20 (float32 rounding is ~1e-6 there)."""


def bf16_view(arch: str, logit_size: float = 20.0) -> ModelView:
    """A tiny bfloat16 model whose unembedding is scaled so that its top logits are about `logit_size`."""
    model = make_tiny_model(arch, seed=0)
    ids = prompts()
    with torch.no_grad():
        top = model(input_ids=ids).logits[:, -1].amax(-1).mean()
        model.get_output_embeddings().weight.mul_(logit_size / float(top))
    model = model.to(torch.bfloat16)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def prompts() -> torch.Tensor:
    return torch.randint(3, 250, (6, 9), generator=torch.Generator().manual_seed(2))


def float64_logits(view: ModelView, resid: torch.Tensor) -> torch.Tensor:
    """The readout written out by hand in float64 from the bfloat16 weights: [batch, d_model] -> [batch, d_vocab]."""
    norm, x = view.final_norm, resid.double()
    w = norm.weight.double()
    if isinstance(norm, torch.nn.LayerNorm):
        normed = F.layer_norm(x, norm.normalized_shape, w, norm.bias.double(), norm.eps)
    else:  # RMSNorm: Llama's weight * x_hat, Gemma's (1 + weight) * x_hat
        eps = getattr(norm, "variance_epsilon", None) or norm.eps
        gain = 1.0 + w if view.spec.name.startswith("gemma") else w
        normed = gain * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return normed @ view.unembed.weight.double().T


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma"])
@torch.no_grad()
def test_bfloat16_readout_equals_float64_arithmetic(arch: str) -> None:
    view = bf16_view(arch)
    ids = prompts()
    mask = torch.ones_like(ids)
    end = torch.full((len(ids),), ids.shape[1] - 1)
    resid = collect_end_states(view, ids, mask, end).resid_final  # [batch, d_model] bfloat16
    assert resid.dtype == torch.bfloat16
    exact = float64_logits(view, resid)  # [batch, d_vocab]
    answers = exact.argmax(-1)
    exact_answer = exact.gather(1, answers[:, None])[:, 0]
    assert 10 < float(exact_answer.min()) and float(exact_answer.max()) < 64, "logits are not ~20: no test"

    got = view.answer_logits(resid, answers)
    assert got.dtype == torch.float32
    assert float((got.double() - exact_answer).abs().max()) <= TOLERANCE
    full = view.end_logits(ids, mask, end)  # [batch, d_vocab], its own forward pass
    assert full.dtype == torch.float32
    assert float((full.double() - exact).abs().max()) <= TOLERANCE

    # the negative control: the readout in the model's dtype is off by far more than the tolerance
    in_bf16 = (view.final_norm(resid) * view.unembed.weight[answers]).sum(-1)
    assert float((in_bf16.double() - exact_answer).abs().max()) > 100 * TOLERANCE
