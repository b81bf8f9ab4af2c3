"""Attribution patching is the derivative of exact patching, and the agreement helpers compute what they say.

The derivative check: in float64, the exact effect of moving each sender's END value from a_ref to
a_ref + eps * (a_cf - a_ref), by the hook-based reference (`reference_patching.py`), divided by eps
(central difference) must equal the attribution estimate, for each variant against its own semantics.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_path_exact import answered_batch, view_of

from arithmech.analysis.agreement import average_ranks, compare_methods, spearman, top_k, top_k_overlap
from arithmech.errors import ConfigError
from arithmech.models.hooks import count_hooks
from arithmech.models.sites import Component, all_components
from arithmech.models.view import ModelView
from arithmech.patching.attribution import attribution_patch
from arithmech.patching.path import PatchResult, path_patch

from reference_patching import ReferencePatcher

ARCHS = ["llama", "llama-mqa", "gemma2", "gpt2", "gpt-neox", "phi3"]
VARIANTS = ["path", "direct", "total"]


def finite_difference(reference: ReferencePatcher, variant: str, eps: float) -> torch.Tensor:
    """[component, batch] central difference of the exact effect along a_cf - a_ref, divided by eps."""
    cf_z, cf_mlp = reference.cf_z, reference.cf_mlp
    sides = []
    try:
        for sign in (1.0, -1.0):
            reference.cf_z = [r + sign * eps * (c - r) for r, c in zip(reference.ref_z, cf_z, strict=True)]
            reference.cf_mlp = [
                r + sign * eps * (c - r) for r, c in zip(reference.ref_mlp, cf_mlp, strict=True)
            ]
            components = all_components(reference.view.dims)
            sides.append(torch.stack([reference.effect(c, variant) for c in components]))
    finally:
        reference.cf_z, reference.cf_mlp = cf_z, cf_mlp
    return (sides[0] - sides[1]) / (2 * eps)


@pytest.mark.parametrize("arch", ARCHS)
def test_attribution_is_the_derivative_of_exact_patching(arch: str) -> None:
    view = view_of(arch)
    view.model.double()
    batch = answered_batch(view, [7, 5, 9, 7])
    reference = ReferencePatcher(view, batch)
    estimates = {v: attribution_patch(view, batch, v, batch_size=3) for v in VARIANTS}
    for variant in VARIANTS:
        derivative = finite_difference(reference, variant, eps=3e-3)
        scale = float(derivative.abs().max())
        assert scale > 1e-2, "derivatives are all ~0: the test could not tell variants apart"
        tolerance = 1e-3 * scale
        torch.testing.assert_close(
            estimates[variant].per_prompt, derivative, atol=tolerance, rtol=0, check_dtype=False
        )
        for other in VARIANTS:  # each variant matches its own semantics only
            if other != variant:
                assert float((estimates[other].per_prompt - derivative).abs().max()) > 10 * tolerance
    assert count_hooks(view.model) == 0


def test_result_layout_matches_path_patch() -> None:
    view = view_of("llama")
    batch = answered_batch(view, [7, 5, 9, 7, 6])
    exact = path_patch(view, batch, "path")
    approx = attribution_patch(view, batch, "path", batch_size=2)
    assert approx.components == exact.components == all_components(view.dims)
    assert approx.per_prompt.shape == exact.per_prompt.shape
    assert approx.variant == "attribution-path"
    torch.testing.assert_close(approx.ref_logit, exact.ref_logit, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(approx.cf_logit, exact.cf_logit, atol=1e-5, rtol=1e-5)
    assert all(p.requires_grad for p in view.model.parameters())
    assert all(p.grad is None for p in view.model.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_estimates_rank_like_exact_effects_on_a_random_counterfactual(arch: str) -> None:
    view = view_of(arch)
    batch = answered_batch(view, [7, 5, 9, 7, 8, 6, 9, 9])
    agreement = compare_methods(path_patch(view, batch, "path"), attribution_patch(view, batch, "path"))
    assert agreement["spearman_all"] > 0
    assert agreement["spearman_heads"] > 0


def test_no_hooks_left_and_grad_flags_restored_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    view = view_of("llama")
    batch = answered_batch(view, [6, 8])
    view.model.lm_head.weight.requires_grad_(False)  # a caller's own flag must come back as it was
    flags = [p.requires_grad for p in view.model.parameters()]

    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("metric failed")

    monkeypatch.setattr(view.final_norm, "forward", boom)  # raises inside the forward, hooks active
    with pytest.raises(RuntimeError, match="metric failed"):
        attribution_patch(view, batch)
    assert count_hooks(view.model) == 0
    monkeypatch.undo()
    monkeypatch.setattr(ModelView, "answer_logits", boom)  # raises after the forward, before backward
    with pytest.raises(RuntimeError, match="metric failed"):
        attribution_patch(view, batch)
    assert count_hooks(view.model) == 0
    assert [p.requires_grad for p in view.model.parameters()] == flags


def test_unknown_variant_is_a_config_error() -> None:
    view = view_of("llama")
    with pytest.raises(ConfigError, match="variant 'paths' is not one of path, direct, total"):
        attribution_patch(view, answered_batch(view, [5]), "paths")  # type: ignore[arg-type]


# -- agreement helpers -----------------------------------------------------------------------------------


def test_average_ranks_share_ties() -> None:
    ranks = average_ranks([10.0, 20.0, 10.0, 5.0, 20.0, 20.0])
    np.testing.assert_allclose(ranks, [2.5, 5.0, 2.5, 1.0, 5.0, 5.0])


def test_spearman_hand_computed() -> None:
    # ranks x: [1, 2.5, 2.5, 4], ranks y: [2, 1, 4, 3]; centred: [-1.5, 0, 0, 1.5] and [-0.5, -1.5, 1.5, 0.5]
    # sum of products = 0.75 + 0.75 = 1.5; norms^2 = 4.5 and 5 -> 1.5 / sqrt(22.5)
    assert spearman([1.0, 2.0, 2.0, 3.0], [0.2, 0.1, 0.9, 0.5]) == pytest.approx(1.5 / np.sqrt(22.5))
    assert spearman(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([30.0, 10.0, 20.0])) == pytest.approx(1.0)
    assert spearman([1.0, 2.0, 3.0], [9.0, 4.0, 1.0]) == pytest.approx(-1.0)
    assert np.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    with pytest.raises(ConfigError, match="cannot correlate 3 values with 2"):
        spearman([1.0, 2.0, 3.0], [1.0, 2.0])


def test_top_k_overlap_takes_most_negative_and_breaks_ties_by_order() -> None:
    a = [-0.5, 0.1, -0.2, -0.2, 0.0]
    b = [-0.1, -0.9, -0.3, 0.2, 0.0]
    assert top_k(a, 3) == [0, 2, 3]  # the tie -0.2/-0.2 keeps component order
    assert top_k(b, 3) == [1, 2, 0]
    assert top_k_overlap(a, b, 3) == pytest.approx(2 / 3)
    assert top_k_overlap(a, b, 1) == 0.0
    assert top_k_overlap(a, a, 5) == 1.0


def test_top_k_larger_than_the_components_is_a_config_error() -> None:
    effects = torch.zeros(30)
    with pytest.raises(ConfigError, match=r"^k=50 is larger than the 30 components$"):
        top_k_overlap(effects, effects, 50)
    with pytest.raises(ConfigError, match="k=0 must be at least 1"):
        top_k_overlap(effects, effects, 0)


def test_compare_methods_splits_heads_and_mlps() -> None:
    components = [Component(0, 0), Component(0, 1), Component(0)]
    components += [Component(1, 0), Component(1, 1), Component(1)]
    exact_effects = torch.tensor([-0.5, -0.1, -0.3, 0.2, -0.4, 0.1])
    approx_effects = torch.tensor([-0.6, -0.2, 0.3, 0.1, -0.5, -0.1])  # heads ranked alike, MLPs swapped

    def result(effects: torch.Tensor, variant: str) -> PatchResult:
        return PatchResult(components, effects[:, None].repeat(1, 2), torch.ones(2), torch.ones(2), variant)

    exact, approx = result(exact_effects, "path"), result(approx_effects, "attribution-path")
    out = compare_methods(exact, approx, ks=(2, 3, 7))
    assert out["spearman_heads"] == pytest.approx(1.0)
    assert out["spearman_mlps"] == pytest.approx(-1.0)
    assert out["spearman_all"] == pytest.approx(spearman(exact_effects, approx_effects))
    assert out["top2_overlap"] == 1.0  # components 0 and 4 in both
    assert out["top3_overlap"] == pytest.approx(2 / 3)  # mlp.0 vs 0.1
    assert "top7_overlap" not in out  # more than the 6 components: left out
    reordered = PatchResult(components[::-1], torch.zeros(6, 2), torch.ones(2), torch.ones(2), "x")
    with pytest.raises(ConfigError, match="different components"):
        compare_methods(exact, reordered)
