"""Rows that continue a run from its cache give what whole runs give, on every architecture, also when the shared
start is longer than a sliding window (the tiny Gemma 2/3 window is 8 tokens)."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from arithmech.models.archs import spec_for_model_type
from arithmech.models.shared_prefix import SharedPrefix, common_prefix_length, full_cache
from arithmech.models.view import ModelView, cache_kwarg
from arithmech.patching.states import collect_end_states

from tiny_models import TINY_ARCHS, make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = sorted(TINY_ARCHS)
TOL = {"atol": 1e-5, "rtol": 1e-4}
SHARED = 12  # longer than the tiny sliding window


@cache
def view_of(arch: str) -> ModelView:
    model = make_tiny_model(arch, seed=0)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def tokens(rows: int, width: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 200, (rows, width), generator=torch.Generator().manual_seed(seed))


def whole_resid(view: ModelView, ids: torch.Tensor) -> torch.Tensor:
    """[row, pos, d_model] of plain runs, entering the final norm."""
    return view.final_resid(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)


def test_common_prefix_length() -> None:
    ids = torch.tensor([[1, 2, 3, 4, 0], [1, 2, 5, 6, 7], [1, 2, 3, 9, 9]])
    assert common_prefix_length(ids, torch.tensor([3, 4, 4])) == 2
    assert common_prefix_length(ids[[0, 0]], torch.tensor([3, 3])) == 3  # END stays in the suffix


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_continue_their_own_row_of_a_run(arch: str) -> None:
    """Path patching's counterfactual run: row i shares its first positions with row i of the reference run."""
    view = view_of(arch)
    ref = tokens(3, SHARED + 5, seed=1)
    cf = torch.cat([ref[:, :SHARED], tokens(3, 5, seed=2)], dim=1)  # each row its own start, new ends
    ref_cache = full_cache()
    with torch.no_grad():
        view.model.base_model(input_ids=ref, use_cache=True, **{cache_kwarg(view.model.base_model): ref_cache})
    prefix = SharedPrefix(view, ref_cache, SHARED)
    rows = torch.tensor([0, 1, 2])
    expected = whole_resid(view, cf)
    got = prefix.final_resid(cf[:, SHARED:], torch.ones(3, 5, dtype=torch.long), rows)
    torch.testing.assert_close(got, expected[:, SHARED:], **TOL)
    end = torch.full((3,), SHARED + 4)
    mask = torch.ones_like(cf)
    continued = collect_end_states(view, cf, mask, end, past=prefix.past(rows))
    whole = collect_end_states(view, cf, mask, end)
    torch.testing.assert_close(continued.resid_pre, whole.resid_pre, **TOL)
    torch.testing.assert_close(continued.z, whole.z, **TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_extended_prefix_serves_copies_of_each_prompt(arch: str) -> None:
    """The heuristic neurons' ablation: a prefix shared by all prompts, each prompt's tokens before END on it,
    and only the END token of every (prompt, copy) row on that."""
    view = view_of(arch)
    shared = tokens(1, SHARED, seed=3)[0]
    own = tokens(2, 4, seed=4)  # each prompt's tokens after the shared ones, END last
    ids = torch.cat([shared.expand(2, SHARED), own], dim=1)  # [prompt, SHARED + 4]
    before_end = SharedPrefix.of_tokens(view, shared).extended(own[:, :-1], torch.zeros(2, dtype=torch.long))
    assert before_end.length == SHARED + 3
    rows = torch.tensor([0, 0, 0, 1, 1, 1])  # three copies of each prompt
    last = own[rows, -1:]  # [row, 1]
    got = before_end.final_resid(last, torch.ones_like(last), rows)[:, -1]
    expected = whole_resid(view, ids)[rows, -1]
    torch.testing.assert_close(got, expected, **TOL)


def test_empty_prefix_runs_whole_rows() -> None:
    view = view_of("llama")
    ids = tokens(2, 6, seed=5)
    empty = SharedPrefix.of_tokens(view, ids[0, :0])
    assert empty.past(torch.zeros(2, dtype=torch.long)) is None
    torch.testing.assert_close(empty.final_resid(ids, torch.ones_like(ids)), whole_resid(view, ids), **TOL)
    started = empty.extended(ids[:, :4], torch.zeros(2, dtype=torch.long))  # nothing shared, each its own start
    got = started.final_resid(ids[:, 4:], torch.ones(2, 2, dtype=torch.long), torch.tensor([0, 1]))
    torch.testing.assert_close(got, whole_resid(view, ids)[:, 4:], **TOL)
