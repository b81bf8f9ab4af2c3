"""Knockout of answers scored token by token: per answer place (teacher forced) and whole answers, against
greedy decoding with the components knocked out by the hand-written reference (tests/reference_knockout.py)."""

from __future__ import annotations

import pytest
import torch

from arithmech.knockout.ablation import ablation_sources, alignment_groups
from arithmech.knockout.sweep import AnswerRows, knockout_sweep
from arithmech.models.archs import spec_for_model_type
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch

from reference_knockout import knocked_logits
from tiny_models import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

N_PROMPTS, LENGTH, ANSWER_TOKENS = 10, 6, 3


def zeroed(model: torch.nn.Module, ids: torch.Tensor, heads: list[tuple[int, int]]) -> torch.Tensor:
    """Logits [batch, pos, d_vocab] of unpadded `ids` with `heads` zeroed at every position (reference hooks)."""
    zeros = [torch.zeros(1, 1, model.config.hidden_size)] * model.config.num_hidden_layers
    return knocked_logits(model, ids, heads, [], zeros, zeros)


def greedy(model: torch.nn.Module, ids: torch.Tensor, heads: list[tuple[int, int]], steps: int) -> torch.Tensor:
    """[batch, steps] tokens written by greedy decoding with `heads` zeroed."""
    out = ids
    for _ in range(steps):
        out = torch.cat([out, zeroed(model, out, heads)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out[:, ids.shape[1] :]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_per_place_and_whole_answer_knockout_equal_greedy_decoding(arch: str) -> None:
    model = make_tiny_model(arch, seed=0)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, model.config.vocab_size - 2, (N_PROMPTS, LENGTH), generator=gen)
    answers = greedy(model, prompts, [], ANSWER_TOKENS)  # the model's own answer: all right with nothing out
    rows = [(torch.cat([prompts[i], answers[i, :j]]), answers[i, j], i, ANSWER_TOKENS - 1 - j)  # j-th: its place
            for i in range(N_PROMPTS) for j in range(ANSWER_TOKENS)]  # fmt: skip
    width = LENGTH + ANSWER_TOKENS - 1
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, (row, _, _, _) in enumerate(rows):
        ids[r, : len(row)], mask[r, : len(row)] = row, 1
    targets = torch.stack([a for _, a, _, _ in rows])
    batch = PatchingBatch(ids, mask, ids.clone(), mask.clone(), mask.sum(1) - 1, targets)
    pair_index = torch.tensor([i for _, _, i, _ in rows])
    place = torch.tensor([q for _, _, _, q in rows])
    keys = [f"t#{q}" for q in place.tolist()]
    groups = tuple("carry" if i % 3 == 0 else "no carry" for i in pair_index.tolist())  # any labels of the pairs
    sources = ablation_sources(view, batch, "zero", alignment_groups(keys, batch.end + 1))
    heads = [Component(layer, head) for layer in range(view.dims.n_layers) for head in range(view.dims.n_heads)]
    sweep = knockout_sweep(view, batch, sources, heads, heads, max_k=4, n_random=2, seed=1, batch_size=7,
                           answer_rows=AnswerRows(pair_index, place, groups))  # fmt: skip
    assert sweep[0].ranking == "none" and sweep[0].accuracy == 1.0
    changed = 0
    for row in sweep:
        knocked = [(c.layer, c.head) for c in map(_parse, row.components)]
        written = greedy(model, prompts, knocked, ANSWER_TOKENS)  # [prompt, token]
        whole = (written == answers).all(1).float().mean()
        assert row.accuracy == pytest.approx(float(whole)), row
        forced = torch.stack([zeroed(model, r[None], knocked)[0, -1] for r, _, _, _ in rows]).argmax(-1)
        forced = forced == batch.answer_ids  # [row] teacher forced: the answer's earlier tokens given
        pair_group = torch.tensor([i % 3 == 0 for i in range(N_PROMPTS)])
        right = (written == answers).all(1)
        cells = {(p, g): (n, accuracy) for p, g, n, accuracy, _ in row.by_place}
        assert list(cells)[0] == (None, "all") and [p for p, g in cells if g == "all"] == [None, 0, 1, 2]
        for p in range(ANSWER_TOKENS):
            at = place == p
            assert cells[(p, "all")] == (N_PROMPTS, pytest.approx(float(forced[at].float().mean()))), (row, p)
            carry = at & torch.tensor([g == "carry" for g in groups])
            assert cells[(p, "carry")] == (int(carry.sum()), pytest.approx(float(forced[carry].float().mean())))
        assert cells[(None, "all")] == (N_PROMPTS, pytest.approx(float(whole)))
        assert cells[(None, "carry")] == (4, pytest.approx(float(right[pair_group].float().mean())))
        assert cells[(None, "no carry")] == (6, pytest.approx(float(right[~pair_group].float().mean())))
        changed += row.accuracy < 1
    assert changed, "no configuration changed an answer: the check has no power"


def _parse(name: str) -> Component:
    layer, head = name.split(".")
    return Component(int(layer), int(head))
