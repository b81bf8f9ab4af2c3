"""A bfloat16 path-patching run ranks the same top components as float32, with effects within 3e-4.

The regime of the issue: a confident prediction whose answer logit is ~20, where bfloat16 moves in steps of 0.125,
and components whose effects move that logit by about half a step. A tiny random model is put there by
making each token's unembedding row its (scaled) input embedding, as a trained model's END residual points at its
answer, and by scaling the attention and MLP output projections down (per arch, so that the largest effect
times the logit is ~0.06). Without that, a random tiny model's bfloat16 residual stream carries 1-2 % errors
(far more than a trained model's), which would hide the readout. The float32 run uses the same
bfloat16-rounded weights, so only the arithmetic differs.

Tolerance, k = 5, 32 prompts: |effect_bf16 - effect_fp32| <= 3e-4 for every component, and the bfloat16 top-5
(most negative) is the float32 top-5 up to components whose float32 effects are within 2 x 3e-4 of the 5th
(ties at the tolerance). Why 3e-4: what is left with the float32 readout is the bfloat16 residual stream's own
rounding (2^-9 of each entry at every addition), ~1e-3 of the answer logit per prompt at d_model 32-64 and
~1e-4 after the mean over 32 prompts; measured over 6 prompt seeds x 3 variants x 2 archs: at most 2.7e-4
(1.7e-4 at this seed). With the logits read out in bfloat16, as before the fix (each logit rounded to a step
of 0.125 at 16-32, ~0.3 % of it), the same runs differ by 3.5e-4 to 1.4e-3 (5.6e-4 to 1.4e-3 at this seed).
"""

from __future__ import annotations

import pytest
import torch
from test_path_exact import answered_batch

from arithmech.models.archs import spec_for_model_type
from arithmech.models.view import ModelView
from arithmech.patching.path import path_patch

from tiny_models import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

TOLERANCE = 3e-4
K = 5
EMBED_SCALE = 2.4
"""Input embeddings (= unembedding rows) times this: answer logits of ~20 (16-32)."""
OUTPUT_SCALE = {"llama": 0.05, "gpt2": 0.1}
"""o_proj and MLP output projections times this: the largest effect moves the answer logit by ~0.06."""


def confident_model(arch: str) -> torch.nn.Module:
    model = make_tiny_model(arch, seed=0)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        embed.mul_(EMBED_SCALE)
        if view.unembed.weight is not embed:  # untied (llama): the readout row of a token is its embedding
            view.unembed.weight.copy_(embed)
        for layer in range(view.dims.n_layers):
            view.o_proj(layer).weight.mul_(OUTPUT_SCALE[arch])
            mlp_out = view.mlp(layer).get_submodule("down_proj" if arch == "llama" else "c_proj")
            mlp_out.weight.mul_(OUTPUT_SCALE[arch])
    return model.to(torch.bfloat16)


def views(arch: str) -> dict[torch.dtype, ModelView]:
    """The bfloat16 model and the same (bfloat16-rounded) weights in float32."""
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        model = confident_model(arch).to(dtype)
        out[dtype] = ModelView(model, spec_for_model_type(model.config.model_type))
    return out


@pytest.mark.parametrize("variant", ["path", "direct", "total"])
@pytest.mark.parametrize("arch", sorted(OUTPUT_SCALE))
def test_bfloat16_ranks_the_same_top_components_as_float32(arch: str, variant: str) -> None:
    by_dtype = views(arch)
    batch = answered_batch(by_dtype[torch.float32], [7, 5, 9, 7, 8, 6, 9, 5] * 4, seed=3)  # answer: own top token
    runs = {dtype: path_patch(view, batch, variant=variant) for dtype, view in by_dtype.items()}
    fp32, bf16 = runs[torch.float32], runs[torch.bfloat16]
    assert 16 < float(fp32.ref_logit.mean()) < 32, "answer logits are not ~20: the regime is not the issue's"
    effects, effects_bf16 = fp32.effects, bf16.effects
    assert float(effects.abs().max()) > 4 * TOLERANCE, "effects are all ~0: nothing to rank"
    assert float((effects_bf16 - effects).abs().max()) <= TOLERANCE

    top, top_bf16 = set(effects.argsort()[:K].tolist()), set(effects_bf16.argsort()[:K].tolist())
    kth = float(effects.sort().values[K - 1])
    swapped = top ^ top_bf16
    assert all(abs(float(effects[c]) - kth) <= 2 * TOLERANCE for c in swapped), (top, top_bf16)
