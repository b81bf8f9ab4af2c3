"""Every analysis that only reads activations builds no autograd graph, called directly as the library API.

On the tiny Gemma 3 (its post-feedforward norm has a weight, so an MLP update read outside `torch.no_grad()`
requires grad: issue #13), each public entry point of analysis/, patching/, knockout/, neurons/ and evaluate/
runs under `grad_guard.GradRecorder`; no operation may produce a tensor that requires grad, except inside
attribution patching's own forward/backward pass, which may not reach the weights. The stages run the same
functions under their own `torch.no_grad()` (test_arch_matrix.py checks them on every architecture); this
table guards the functions for callers that do not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from arithmech.analysis.attention import end_attention
from arithmech.analysis.logit_lens import (
    largest_number,
    mlp_cosines,
    mlp_update,
    number_token_ids,
    operand_token_ids,
    update_ranks,
)
from arithmech.data.mediation_generate import MediationDataConfig, generate_mediation_pairs
from arithmech.data.mediation_tokens import tokenize_mediation_pairs
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import build_reference_set
from arithmech.evaluate.choice import score_choices
from arithmech.evaluate.general import general_scores
from arithmech.evaluate.general_texts import GeneralText
from arithmech.evaluate.generation import generate_greedy
from arithmech.knockout.ablation import ablation_sources, alignment_groups
from arithmech.knockout.batched import knockout_scores
from arithmech.knockout.end_only import end_knockout_scores, end_states
from arithmech.knockout.sweep import knockout_sweep
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.models.predictions import predict_at_end, top_tokens_at
from arithmech.models.shared_prefix import common_prefix_length
from arithmech.models.sites import Component, all_components
from arithmech.neurons import (
    LoraTrainConfig,
    attention_li,
    coefficient_change,
    comparative_neurons,
    end_coefficients,
    head_importance,
    neuron_li,
    pruning_sweep,
    top_neurons_report,
    train_layer_lora,
)
from arithmech.patching.attribution import attribution_patch
from arithmech.patching.mediation import mediation_effects, neuron_effects
from arithmech.patching.path import PatchingBatch, end_logits, path_patch
from arithmech.patching.states import collect_end_states
from arithmech.patching.total import total_patched_logits

from grad_guard import GradRecorder

pytestmark = pytest.mark.usefixtures("one_thread")
LORA = LoraTrainConfig(layers=(1,), modules=("mlp",), rank=2, steps=1, batch_size=4)


@dataclass(frozen=True)
class Ctx:
    handle: ModelHandle
    batch: PatchingBatch
    pairs: list[Any]
    groups: list[str]
    items: list[Any]
    adapter: Any

    @property
    def view(self) -> Any:
        return self.handle.view

    def states(self, cf: bool = False, keep_cache: bool = False) -> Any:
        b = self.batch
        ids, mask = (b.cf_ids, b.cf_mask) if cf else (b.ref_ids, b.ref_mask)
        return collect_end_states(self.view, ids, mask, b.end, keep_cache=keep_cache)


@pytest.fixture(scope="module")
def ctx(tiny_model_dir: Callable[[str], Path]) -> Ctx:
    handle = load_model(ModelConfig(model=str(tiny_model_dir("gemma3"))))
    ref = ReferenceSetConfig(filter_correct=False, formations=("equation",), n_per_template=2, max_prompts=8)
    t = build_reference_set(handle, ref).tokenized
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    groups = alignment_groups([p.template_id for p in t.pairs], t.end + 1)
    mediation = MediationDataConfig(tasks=("addition",), formats=("equation",), n_per_template=2, few_shot=1)
    items, _ = tokenize_mediation_pairs(handle.tokenizer, list(generate_mediation_pairs(mediation))[:4])
    adapter = train_layer_lora(handle, t.ref_ids, t.ref_mask, t.end, t.answer_ids, LORA)
    return Ctx(handle, batch, t.pairs, groups, items, adapter)


def _lens(c: Ctx, what: str) -> Any:
    a_ids, b_ids = operand_token_ids(c.handle.tokenizer, c.pairs)
    numbers = number_token_ids(c.handle.tokenizer, c.pairs, largest_number(c.pairs))
    if what == "ranks":
        return update_ranks(c.view, c.states(), numbers["C"])
    return mlp_cosines(c.view, c.states(), a_ids, b_ids, c.batch.answer_ids, numbers)


def _end_only_knockout(c: Ctx) -> Any:
    prefix = common_prefix_length(c.batch.ref_ids, c.batch.end)
    _, values = end_states(c.view, c.batch, prefix)
    return end_knockout_scores(c.view, c.batch, values.mean(), [[], [Component(0, 1)]], prefix)


def _knockout(c: Ctx, mode: str) -> Any:
    sources = ablation_sources(c.view, c.batch, mode, c.groups, min_group_size=2)
    heads = [x for x in all_components(c.view.dims) if x.head is not None]
    return knockout_sweep(c.view, c.batch, sources, heads[:3], heads, max_k=2, n_random=1)


def _pruning(c: Ctx) -> Any:
    b, width = c.batch, end_coefficients(c.view, c.batch.ref_ids, c.batch.ref_mask, c.batch.end, [0]).shape[-1]
    scores = torch.arange(2 * width, dtype=torch.float32).reshape(2, width)
    return pruning_sweep(c.view, b.ref_ids, b.ref_mask, b.end, b.answer_ids, scores, [0, 1], [0, 4], n_random=1)


def _comparative(c: Ctx) -> Any:
    result = comparative_neurons(c.view, c.batch, Component(1, 0), [1, 2])
    return top_neurons_report(c.view, c.handle.tokenizer, result, k=3, n_tokens=3)


def _evaluate(c: Ctx) -> Any:
    tok = c.handle.tokenizer
    generate_greedy(c.handle.model, tok, ["1+2=", "3+4="], max_new_tokens=2)
    score_choices(c.view, tok, ["Sky is"], [["blue", "green"]])
    return general_scores(c.view, tok, [GeneralText("a", "Bread needs flour.")], base_view=c.view, base_tokenizer=tok)


def _coefficient_change(c: Ctx) -> Any:
    b = c.batch
    return coefficient_change(c.handle, c.adapter, b.ref_ids, b.ref_mask, b.end, [(1, 0), (1, 3)], b.answer_ids)


CASES: dict[str, Callable[[Ctx], Any]] = {
    "logit_lens.mlp_update": lambda c: mlp_update(c.view, c.states()),
    "logit_lens.mlp_cosines": lambda c: _lens(c, "cosines"),
    "logit_lens.update_ranks": lambda c: _lens(c, "ranks"),
    "attention.end_attention": lambda c: end_attention(c.view, c.batch.ref_ids, c.batch.ref_mask, c.batch.end, [0, 2]),
    "end_only.end_states+end_knockout_scores": _end_only_knockout,
    "path.path_patch-path": lambda c: path_patch(c.view, c.batch, "path"),
    "path.path_patch-direct": lambda c: path_patch(c.view, c.batch, "direct"),
    "path.path_patch-total": lambda c: path_patch(c.view, c.batch, "total"),
    "path.end_logits": lambda c: end_logits(c.view, c.states(), c.batch.answer_ids),
    "attribution.attribution_patch-path": lambda c: attribution_patch(c.view, c.batch, "path"),
    "attribution.attribution_patch-total": lambda c: attribution_patch(c.view, c.batch, "total"),
    "total.total_patched_logits": lambda c: total_patched_logits(
        c.view, c.batch, c.states(keep_cache=True), c.states(cf=True)
    ),
    "mediation.mediation_effects": lambda c: mediation_effects(c.view, c.items),
    "mediation.neuron_effects": lambda c: neuron_effects(c.view, c.items, layer=1, neurons=[0, 5]),
    "knockout.mean": lambda c: _knockout(c, "mean"),
    "knockout.zero": lambda c: _knockout(c, "zero"),
    "knockout.resample": lambda c: _knockout(c, "resample"),
    "knockout.knockout_scores": lambda c: knockout_scores(
        c.view, c.batch, ablation_sources(c.view, c.batch, "zero", c.groups), [[Component(0, 0)]]
    ),
    "predictions.predict_at_end": lambda c: predict_at_end(
        c.view, c.batch.ref_ids, c.batch.ref_mask, c.batch.end, c.batch.answer_ids
    ),
    "predictions.top_tokens_at": lambda c: top_tokens_at(
        c.view, [ids[: int(e) + 1].tolist() for ids, e in zip(c.batch.ref_ids, c.batch.end, strict=True)],
        [[int(e)] for e in c.batch.end], 0, batch_size=3,
    ),
    "neurons.head_importance": lambda c: head_importance(c.view, {"addition": c.batch}, include_mlps=True),
    "neurons.comparative_neurons+top_neurons_report": _comparative,
    "neurons.neuron_li": lambda c: neuron_li(c.view, c.batch, [0, 2]),
    "neurons.attention_li": lambda c: attention_li(c.view, c.batch, [0, 1, 2]),
    "neurons.pruning_sweep": _pruning,
    "neurons.coefficient_change": _coefficient_change,
    "evaluate.generate+choices+general": _evaluate,
}


@pytest.mark.parametrize("name", list(CASES))
def test_builds_no_graph(ctx: Ctx, name: str) -> None:
    with GradRecorder() as recorder:
        CASES[name](ctx)
    assert recorder.unexpected() == []
    if name.startswith("attribution."):  # its one backward pass still has the activations' graph it needs
        assert recorder.allowed["graph"] > 0 and not recorder.allowed["weights"]


def test_lora_training_takes_gradients_under_no_grad(ctx: Ctx) -> None:
    """The neurons stage runs under torch.no_grad(); the LoRA adapter it trains must still learn."""
    b = ctx.batch
    with torch.no_grad():
        adapter = train_layer_lora(ctx.handle, b.ref_ids, b.ref_mask, b.end, b.answer_ids, LORA)
    assert any(v.abs().sum() > 0 for k, v in adapter.state.items() if "lora_B" in k)  # B starts at zero
