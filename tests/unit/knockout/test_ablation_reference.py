"""Mean and zero ablation, one configuration (`ablate`) and batched (`knockout_scores`), against the hand-written
reference of tests/reference_knockout.py, which shares no code with `arithmech.knockout` or `ModelView`.

The batch holds two groups (two templates, two token lengths) of 8 prompts each, right-padded together for the
engine; the reference runs each group on its own, unpadded, so padding and group boundaries are checked too.
"""

from __future__ import annotations

import pytest
import torch

from arithmech.knockout.ablation import AblationSources, ablate, ablation_sources, alignment_groups
from arithmech.knockout.batched import knockout_scores
from arithmech.models.archs import spec_for_model_type
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch

from reference_knockout import knocked_logits, mean_values
from tiny_models import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = ["llama", "qwen2", "gpt2"]  # llama and qwen2 are GQA (4 query heads, 2 kv heads); gpt2 has Conv1D
GROUP_SIZE = 8
LENGTHS = (7, 10)
CONFIGS = {  # name -> ((layer, head) pairs, MLP layers)
    "head": ([(1, 2)], []),
    "mlp": ([], [0]),
    "heads-and-mlp": ([(0, 1), (1, 3), (1, 0)], [1]),
}


def components(heads: list[tuple[int, int]], mlps: list[int]) -> list[Component]:
    return [Component(layer, head) for layer, head in heads] + [Component(layer) for layer in mlps]


def groups_of(model: torch.nn.Module, seed: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(reference ids, counterfactual ids), each [GROUP_SIZE, n], per length n: the counterfactual changes one
    token (the 'operator', at n // 2) in every prompt of the group."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size - 2  # not pad / eos
    out = []
    for n in LENGTHS:
        ref = torch.randint(0, vocab, (GROUP_SIZE, n), generator=gen)
        cf = ref.clone()
        cf[:, n // 2] = (ref[:, n // 2] + 1 + torch.randint(0, vocab - 1, (GROUP_SIZE,), generator=gen)) % vocab
        out.append((ref, cf))
    return out


def padded_batch(groups: list[tuple[torch.Tensor, torch.Tensor]], answers: torch.Tensor) -> PatchingBatch:
    """The groups stacked and right-padded (pad id 0, mask 0) into one batch, as the stages build it."""
    width = max(ref.shape[1] for ref, _ in groups)
    rows = [(r, c) for ref, cf in groups for r, c in zip(ref, cf, strict=True)]
    ref_ids = torch.zeros(len(rows), width, dtype=torch.long)
    cf_ids = torch.zeros_like(ref_ids)
    mask = torch.zeros_like(ref_ids)
    for i, (r, c) in enumerate(rows):
        ref_ids[i, : len(r)], cf_ids[i, : len(c)], mask[i, : len(r)] = r, c, 1
    return PatchingBatch(ref_ids, mask, cf_ids, mask.clone(), mask.sum(1) - 1, answers)


def reference_logits(
    model: torch.nn.Module, groups: list[tuple[torch.Tensor, torch.Tensor]], mode: str, config: str
) -> list[torch.Tensor]:
    """Per group: logits [GROUP_SIZE, n, d_vocab] with `config` knocked out, by the hand-written reference."""
    heads, mlps = CONFIGS[config]
    prompts = [cf[i : i + 1] for _, cf in groups for i in range(GROUP_SIZE)]  # [1, n] each
    values, _ = mean_values(model, prompts, [f"template-{cf.shape[1]}" for cf in prompts])
    out = []
    for g, (ref, _) in enumerate(groups):
        z, mlp_out = values[g * GROUP_SIZE]  # the same for every prompt of the group
        if mode == "zero":
            z, mlp_out = [torch.zeros_like(t) for t in z], [torch.zeros_like(t) for t in mlp_out]
        out.append(knocked_logits(model, ref, heads, mlps, z, mlp_out))
    return out


def engine_inputs(arch: str) -> tuple[ModelView, list[tuple[torch.Tensor, torch.Tensor]], PatchingBatch]:
    model = make_tiny_model(arch, seed=0)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    groups = groups_of(model)
    with torch.no_grad():
        answers = torch.cat([model(input_ids=ref).logits[:, -1].argmax(-1) for ref, _ in groups])
    return view, groups, padded_batch(groups, answers)


def sources_for(view: ModelView, batch: PatchingBatch, mode: str) -> AblationSources:
    keys = [f"template-{n}" for n in LENGTHS for _ in range(GROUP_SIZE)]
    return ablation_sources(view, batch, mode, alignment_groups(keys, batch.end + 1))


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("mode", ["mean", "zero"])
@pytest.mark.parametrize("arch", ARCHS)
def test_ablate_equals_the_hand_written_knockout(arch: str, mode: str, config: str) -> None:
    view, groups, batch = engine_inputs(arch)
    expected = reference_logits(view.model, groups, mode, config)
    with torch.no_grad():
        plain = view.model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask).logits
        with ablate(view, components(*CONFIGS[config]), sources_for(view, batch, mode)):
            knocked = view.model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask).logits
    for g, want in enumerate(expected):
        rows, n = slice(g * GROUP_SIZE, (g + 1) * GROUP_SIZE), want.shape[1]  # real positions of the group only
        torch.testing.assert_close(knocked[rows, :n], want, atol=1e-5, rtol=1e-5)
        assert (plain[rows, :n] - want).abs().max() > 1e-2  # the knockout changes the logits: the check has power


@pytest.mark.parametrize("mode", ["mean", "zero"])
@pytest.mark.parametrize("arch", ARCHS)
def test_batched_scores_equal_the_hand_written_knockout(arch: str, mode: str) -> None:
    """Every configuration in one call, rows of different configurations mixed in each forward pass."""
    view, groups, batch = engine_inputs(arch)
    names = list(CONFIGS)
    scores = knockout_scores(
        view, batch, sources_for(view, batch, mode), [components(*CONFIGS[name]) for name in names], batch_size=5
    )
    for i, name in enumerate(names):
        at_end = torch.cat([logits[:, -1] for logits in reference_logits(view.model, groups, mode, name)])
        prob = at_end.softmax(-1)[torch.arange(len(batch)), batch.answer_ids]
        torch.testing.assert_close(scores.answer_prob[i], prob, atol=1e-5, rtol=1e-5)
        assert torch.equal(scores.correct[i], at_end.argmax(-1) == batch.answer_ids)
