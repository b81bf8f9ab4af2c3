"""Causal mediation (patching/mediation.py) against a plain two-run computation on tiny random models.

The plain reference runs one full, unbatched forward pass per intervention with a hand-written hook that sets
one position of one module's output (or one neuron's activation) to its value on the alternative prompt, and
reads P(r) and P(r') from the model's own logits.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from arithmech.data.mediation_generate import generate_mediation_pairs
from arithmech.data.mediation_prompts import INTERVENTIONS, MediationDataConfig, MediationPair
from arithmech.data.mediation_tokens import (
    POSITION_CLASSES,
    TokenizedMediationPair,
    position_classes,
    tokenize_mediation_pairs,
)
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks
from arithmech.models.view import ModelView
from arithmech.patching.mediation import (
    COMPONENTS,
    MediationResult,
    indirect_effect,
    mediation_effects,
    neuron_effects,
    neuron_overlap,
    top_neurons,
)

from forward_cost import count_layer_tokens
from tiny_models import TINY_ARCHS, make_tiny_model, make_tiny_tokenizer

TOL = {"atol": 1e-5, "rtol": 1e-5}


def view_of(arch: str) -> ModelView:
    model = make_tiny_model(arch, seed=0)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def tiny_items(n: int = 3, intervention: str = "operands-and-result", few_shot: int = 1) -> list[Any]:
    cfg = MediationDataConfig(
        tasks=("addition",), formats=("equation",), interventions=(intervention,), n_per_template=n, few_shot=few_shot
    )
    pairs = [p for p in generate_mediation_pairs(cfg) if p.template_id == "med-eq-1"]
    items, report = tokenize_mediation_pairs(make_tiny_tokenizer(), pairs)
    assert report.kept == len(pairs)  # byte-level: same characters => same token length
    return items


# -- the plain reference ---------------------------------------------------------------------------------
def _plain_run(model: Any, ids: torch.Tensor, module: Any = None, edit: Any = None, pre: bool = False) -> Any:
    """END probabilities [d_vocab] of one prompt, with `edit(tensor)` applied to module's output (or input)."""
    captured: list[torch.Tensor] = []

    def post_hook(_m: Any, _a: Any, out: Any) -> Any:
        t = out[0] if isinstance(out, tuple) else out
        captured.append(t[0].detach().clone())
        if edit is None:
            return None
        t = edit(t.clone())
        return (t, *out[1:]) if isinstance(out, tuple) else t

    def pre_hook(_m: Any, args: tuple[Any, ...]) -> Any:
        captured.append(args[0][0].detach().clone())
        return None if edit is None else (edit(args[0].clone()), *args[1:])

    handle = None
    if module is not None:
        handle = module.register_forward_pre_hook(pre_hook) if pre else module.register_forward_hook(post_hook)
    try:
        with torch.no_grad():
            probs = model(input_ids=ids[None]).logits[0, -1].float().softmax(-1)
    finally:
        if handle is not None:
            handle.remove()
    return probs, (captured[0] if captured else None)


def _plain_ie(view: ModelView, item: TokenizedMediationPair, module: Any, pos: int, neuron: int | None = None) -> float:
    r, r2 = item.result_id, item.alt_result_id
    p_base, _ = _plain_run(view.model, item.base_ids)
    pre = neuron is not None
    _, alt_value = _plain_run(view.model, item.alt_ids, module, pre=pre)  # [pos, d]

    def edit(t: torch.Tensor) -> torch.Tensor:
        if neuron is None:
            t[0, pos] = alt_value[pos]
        else:
            t[0, pos, neuron] = alt_value[pos, neuron]
        return t

    p_star, _ = _plain_run(view.model, item.base_ids, module, edit, pre=pre)
    return float(indirect_effect(p_base[r], p_base[r2], p_star[r], p_star[r2]))


# -- layer x position indirect effects ---------------------------------------------------------------------
@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_ie_matches_plain_two_run(arch: str) -> None:
    view = view_of(arch)
    items = tiny_items(1) + tiny_items(1, "operator")
    result = mediation_effects(view, items, max_rows=7)  # small blocks: many cache prefixes and block edges
    assert count_hooks(view.model) == 0
    for i, item in enumerate(items):
        n = len(item.base_ids)
        expected = torch.tensor(
            [
                [
                    [_plain_ie(view, item, view.mlp(layer) if c == "mlp" else view.o_proj(layer), p) for p in range(n)]
                    for layer in range(view.dims.n_layers)
                ]
                for c in COMPONENTS
            ]
        )  # [component, layer, pos]
        torch.testing.assert_close(result.ie[i, :, :, :n], expected, **TOL)
        assert result.ie[i].abs().max() > 1e-3  # the tiny model is sensitive: a vacuous test would pass too
        assert torch.isnan(result.ie[i, :, :, n:]).all()


def test_rows_run_only_the_layers_and_positions_they_can_change() -> None:
    """An intervention at (layer l, position p) runs layers l.. on positions p.. only: layer m sees the base and
    alternative run (2 n tokens), then at each position p, n - p tokens of each site at a layer <= m."""
    view = view_of("llama")
    (item,) = tiny_items(1)
    n, first = len(item.base_ids), int((item.base_ids != item.alt_ids).nonzero()[0])
    with count_layer_tokens(view) as seen:
        mediation_effects(view, [item])
    sites_up_to = [len(COMPONENTS) * (m + 1) for m in range(view.dims.n_layers)]
    assert seen == [2 * n + sum((n - p) * sites_up_to[m] for p in range(first, n)) for m in range(view.dims.n_layers)]


def test_total_effect_matches_alternative_run() -> None:
    view = view_of("llama")
    items = tiny_items(3)
    result = mediation_effects(view, items, layers=[0], components=["mlp"])
    for i, item in enumerate(items):
        p, _ = _plain_run(view.model, item.base_ids)
        p_alt, _ = _plain_run(view.model, item.alt_ids)
        r, r2 = item.result_id, item.alt_result_id
        te = indirect_effect(p[r], p[r2], p_alt[r], p_alt[r2])
        torch.testing.assert_close(result.total_effect[i], te, **TOL)
        torch.testing.assert_close(result.probs[i], torch.stack([p[r], p[r2], p_alt[r], p_alt[r2]]), **TOL)


def test_batched_rows_equal_one_row_per_pass() -> None:
    view = view_of("gpt-neox")
    items = tiny_items(2, "operands-same-result")
    one = mediation_effects(view, items, max_rows=1)
    many = mediation_effects(view, items, max_rows=10_000)
    torch.testing.assert_close(one.ie, many.ie, atol=1e-6, rtol=1e-5, equal_nan=True)


def test_layer_and_component_subsets_select_the_same_numbers() -> None:
    view = view_of("llama")
    items = tiny_items(1)
    full = mediation_effects(view, items)
    part = mediation_effects(view, items, layers=[2, 0], components=["attn"])
    torch.testing.assert_close(part.ie[:, 0], full.ie[:, 1, [2, 0]], equal_nan=True, **TOL)
    assert part.by_class().shape == (1, 2, len(POSITION_CLASSES))


def test_identical_prompts_have_zero_effects() -> None:
    view = view_of("llama")
    (item,) = tiny_items(1)
    same = TokenizedMediationPair(
        item.pair, item.base_ids, item.base_ids.clone(), item.result_id, item.alt_result_id, item.position_class,
        item.number_ids,
    )  # fmt: skip
    result = mediation_effects(view, [same])
    assert result.ie.abs().max() == 0 and result.total_effect.abs().max() < 1e-6
    assert neuron_effects(view, [same], layer=1).abs().max() == 0


def test_positions_before_the_first_difference_are_exactly_zero() -> None:
    view = view_of("gpt2")
    items = tiny_items(2, few_shot=2)
    result = mediation_effects(view, items)
    for i, item in enumerate(items):
        first = int((item.base_ids != item.alt_ids).nonzero()[0])
        assert first > 0 and (result.ie[i, :, :, :first] == 0).all()
        assert (result.ie[i, :, :, first:len(item.base_ids)] != 0).any()


def test_number_accuracy_is_the_argmax_among_number_tokens() -> None:
    view = view_of("llama")
    items = tiny_items(3)
    result = mediation_effects(view, items, layers=[0], components=["mlp"])
    for i, item in enumerate(items):
        p, _ = _plain_run(view.model, item.base_ids)
        ids = torch.tensor(item.number_ids)
        assert result.number_correct[i] == float(int(ids[p[ids].argmax()]) == item.result_id)
    assert len(items[0].number_ids) == 10  # digits 0-9: one byte token each


# -- aggregation by position class -------------------------------------------------------------------------
def test_position_classes_of_a_hand_made_prompt() -> None:
    tok = make_tiny_tokenizer()
    text = "Q: What is 3 plus 52? A: "  # byte-level: one token per character
    spans = {"operand1": (11, 12), "operand2": (18, 20)}
    offsets = [tuple(o) for o in tok(text, return_offsets_mapping=True)["offset_mapping"]]
    names = [POSITION_CLASSES[c] for c in position_classes(offsets, spans)]
    expected = ["early"] * 11 + ["operand1"] + ["middle"] * 6 + ["operand2"] * 2 + ["late"] * 4 + ["last"]
    assert names == expected
    facts = [POSITION_CLASSES[c] for c in position_classes(offsets[:8], {"operand1": (3, 7)})]
    assert facts == ["early"] * 3 + ["operand1"] * 4 + ["last"]
    assert [POSITION_CLASSES[c] for c in position_classes(offsets[:3], {"operand1": (0, 1)})] == [
        "operand1", "late", "last",
    ]  # fmt: skip


def test_by_class_means_over_positions_then_pairs() -> None:
    ie = torch.full((2, 1, 1, 4), float("nan"))
    ie[0, 0, 0] = torch.tensor([1.0, 3.0, 5.0, 7.0])
    ie[1, 0, 0, :3] = torch.tensor([2.0, 4.0, 6.0])
    classes = torch.tensor([[1, 1, 4, 5], [1, 3, 5, -1]])  # operand1 operand1 late last / operand1 operand2 last
    result = MediationResult(
        ie, classes, torch.zeros(2), torch.ones(2, 4), torch.zeros(2), layers=(0,), components=("mlp",)
    )
    by_class = result.by_class()[0, 0]  # [class]
    expected = torch.tensor([float("nan"), (2.0 + 2.0) / 2, float("nan"), 4.0, 5.0, (7.0 + 6.0) / 2])
    torch.testing.assert_close(by_class, expected, equal_nan=True)
    median = result.by_class("median")[0, 0]  # lower median of two values, as torch.nanmedian
    torch.testing.assert_close(median, torch.tensor([float("nan"), 2.0, float("nan"), 4.0, 5.0, 6.0]), equal_nan=True)


# -- neurons -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt-neox"])
def test_neuron_ie_matches_plain_loop(arch: str) -> None:
    view = view_of(arch)
    items = tiny_items(2)
    neurons = [0, 5, 17, 63]
    result = neuron_effects(view, items, layer=1, neurons=neurons, max_rows=3)
    assert result.shape == (2, len(neurons)) and count_hooks(view.model) == 0
    for i, item in enumerate(items):
        end = len(item.base_ids) - 1
        expected = torch.tensor([_plain_ie(view, item, view.down_proj(1), end, neuron=k) for k in neurons])
        torch.testing.assert_close(result[i], expected, **TOL)
    assert result.abs().max() > 1e-4


def test_neuron_rows_start_at_their_layer() -> None:
    """Neurons of layer 2 at END: below it, one stand-in token per batch of rows; from it, one token per neuron."""
    view = view_of("llama")
    (item,) = tiny_items(1)
    n = len(item.base_ids)
    with count_layer_tokens(view) as seen:
        neuron_effects(view, [item], layer=2, neurons=range(10), max_rows=4)
    assert seen == [2 * n + 3, 2 * n + 3, 2 * n + 10]  # 3 batches of rows: 4 + 4 + 2 neurons


def test_top_neurons_and_overlap() -> None:
    a = torch.tensor([0.9, 0.1, 0.8, 0.0, 0.7])
    b = torch.tensor([[0.9, 0.0, 0.0, 0.8, 0.1], [0.9, 0.0, 0.0, 0.8, 0.1]])
    assert top_neurons(a, 3) == [0, 2, 4]
    assert neuron_overlap(a, b, 2) == 0.5
    assert neuron_overlap(a, a, 5) == 1.0


# -- hooks ---------------------------------------------------------------------------------------------------
def test_hooks_are_removed_on_errors() -> None:
    view = view_of("llama")
    (item,) = tiny_items(1)
    broken = TokenizedMediationPair(
        item.pair, item.base_ids, item.alt_ids.clone().fill_(10_000), item.result_id, item.alt_result_id,
        item.position_class, item.number_ids,
    )  # fmt: skip  (token id beyond the vocabulary: the forward pass raises inside the hooks block)
    with pytest.raises(IndexError):
        mediation_effects(view, [broken])
    with pytest.raises(IndexError):
        neuron_effects(view, [broken], layer=0)
    assert count_hooks(view.model) == 0


def test_all_intervention_types_tokenize_on_the_tiny_tokenizer() -> None:
    cfg = MediationDataConfig(
        tasks=("addition", "retrieval", "factual"), interventions=INTERVENTIONS, n_per_template=2, few_shot=0
    )
    pairs: list[MediationPair] = generate_mediation_pairs(cfg)
    items, report = tokenize_mediation_pairs(make_tiny_tokenizer(), pairs)
    assert report.kept + report.rejected_length_mismatch + report.rejected_same_result_token == len(pairs)
    assert {i.pair.task for i in items} == {"addition", "retrieval", "factual"}
    assert all(i.number_ids is None for i in items if i.pair.task == "factual")


# -- the real default model ----------------------------------------------------------------------------------
@pytest.mark.default_model
def test_default_model_tiny_mediation() -> None:
    pytest.importorskip("gguf")
    from arithmech.models.load import load_model

    handle = load_model()
    cfg = MediationDataConfig(tasks=("addition",), formats=("equation",), n_per_template=2, few_shot=3)
    items, report = tokenize_mediation_pairs(handle.tokenizer, generate_mediation_pairs(cfg))
    assert report.kept == len(items) == 4
    result = mediation_effects(handle.view, items)
    heatmap = result.by_class()  # [component, layer, class]
    assert heatmap.shape == (len(COMPONENTS), handle.dims.n_layers, len(POSITION_CLASSES))
    assert torch.isfinite(heatmap[:, :, 1:]).all() and (heatmap[:, :, 0] == 0).all()  # early: the shared prefix
    assert torch.isfinite(result.total_effect).all() and 0 <= result.number_accuracy() <= 1
    assert count_hooks(handle.model) == 0
