"""The fast path-patching engine equals the one-forward-per-component reference on every architecture."""

from __future__ import annotations

import pytest
import torch

from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks, hooks
from arithmech.models.sites import Component, all_components
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch, length_chunks, path_patch
from arithmech.patching.states import collect_end_states
from arithmech.patching.total import total_patched_logits

from reference_patching import ReferencePatcher, end_logits
from tiny_models import TINY_ARCHS, make_tiny_model


def random_batch(vocab: int, lengths: list[int], seed: int = 1, shared_start: bool = False) -> PatchingBatch:
    """Right-padded prompt pairs of different lengths; the counterfactual differs at two positions, or with
    `shared_start` at one past the middle only, so that the pairs share their start (as few-shot prompts do)."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ref = torch.randint(3, vocab - 2, (len(lengths), width), generator=gen)
    cf = ref.clone()
    mask = torch.zeros_like(ref)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        cf[i, n // 2] = (ref[i, n // 2] + 7) % (vocab - 5) + 3  # the "operator" token
        if not shared_start:
            cf[i, 0] = (ref[i, 0] + 11) % (vocab - 5) + 3
        ref[i, n:] = 0
        cf[i, n:] = 0
    end = torch.tensor(lengths) - 1
    answers = torch.randint(3, vocab - 2, (len(lengths),), generator=gen)
    return PatchingBatch(ref, mask, cf, mask.clone(), end, answers)


def answered_batch(view: ModelView, lengths: list[int], seed: int = 1, shared_start: bool = False) -> PatchingBatch:
    """A random batch whose answer is the model's own top token, as in a filtered reference set."""
    batch = random_batch(int(view.dims.d_vocab), lengths, seed, shared_start)
    with torch.no_grad():
        logits = view.model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask).logits
    top = logits[torch.arange(len(lengths)), batch.end].argmax(-1)
    return PatchingBatch(batch.ref_ids, batch.ref_mask, batch.cf_ids, batch.cf_mask, batch.end, top)


def view_of(arch: str) -> ModelView:
    model = make_tiny_model(arch, seed=0)
    return ModelView(model, spec_for_model_type(model.config.model_type))


@pytest.mark.parametrize("variant", ["path", "direct", "total"])
@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_fast_equals_reference(arch: str, variant: str) -> None:
    view = view_of(arch)
    batch = answered_batch(view, [7, 5, 9, 7])
    fast = path_patch(view, batch, variant=variant, batch_size=3)
    reference = ReferencePatcher(view, batch)
    expected = torch.stack([reference.effect(c, variant) for c in all_components(view.dims)])
    assert fast.per_prompt.shape == expected.shape
    torch.testing.assert_close(fast.per_prompt, expected, atol=1e-5, rtol=1e-4)
    assert expected.abs().max() > 1e-3, "effects are all ~0: the test could not tell variants apart"
    assert count_hooks(view.model) == 0


@pytest.mark.parametrize("variant", ["path", "total"])
@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_shared_start_equals_reference(arch: str, variant: str) -> None:
    """Pairs that share their first positions: the counterfactual run starts from the reference run's cache."""
    view = view_of(arch)
    batch = answered_batch(view, [10, 7, 9, 10], shared_start=True)
    assert batch.shared_length() == 3  # the shortest prompt's operator position, 7 // 2
    fast = path_patch(view, batch, variant=variant, batch_size=4)
    reference = ReferencePatcher(view, batch)
    expected = torch.stack([reference.effect(c, variant) for c in all_components(view.dims)])
    torch.testing.assert_close(fast.per_prompt, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fast.cf_logit, reference.cf_logit, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["path", "total"])
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3", "gpt-neox"])
def test_chunks_of_about_one_length_keep_the_batch_order(arch: str, variant: str) -> None:
    """Prompts are chunked by length (within 1/16, so some padding is left) and come back in the batch's order,
    each equal to its own scan alone (no padding, no other prompt)."""
    view = view_of(arch)
    batch = answered_batch(view, [34, 6, 32, 33, 7, 32, 20], shared_start=True)
    chunks = length_chunks(batch, 3)
    assert [c.tolist() for c in chunks] == [[1], [4], [6], [2, 5, 3], [0]]  # lengths 6, 7, 20, 32-33, 34
    grouped = path_patch(view, batch, variant=variant, batch_size=3)
    alone = [path_patch(view, batch.select(slice(i, i + 1)), variant=variant) for i in range(len(batch))]
    torch.testing.assert_close(grouped.per_prompt, torch.cat([a.per_prompt for a in alone], 1), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grouped.cf_logit, torch.cat([a.cf_logit for a in alone]), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_total_in_small_blocks_equals_one_block(arch: str) -> None:
    """Blocks of a few rows start at later layers (one stand-in row below them) or at the final norm."""
    view = view_of(arch)
    batch = answered_batch(view, [7, 5, 9, 7])
    ref = collect_end_states(view, batch.ref_ids, batch.ref_mask, batch.end, keep_cache=True)
    cf = collect_end_states(view, batch.cf_ids, batch.cf_mask, batch.end)
    small = total_patched_logits(view, batch, ref, cf, max_rows=3)
    torch.testing.assert_close(small, total_patched_logits(view, batch, ref, cf), atol=1e-6, rtol=1e-5)
    assert count_hooks(view.model) == 0


def test_patching_clean_into_clean_is_zero() -> None:
    view = view_of("llama")
    batch = random_batch(int(view.dims.d_vocab), [6, 8])
    same = PatchingBatch(
        batch.ref_ids, batch.ref_mask, batch.ref_ids, batch.ref_mask, batch.end, batch.answer_ids
    )
    for variant in ("path", "direct", "total"):
        result = path_patch(view, same, variant=variant)
        assert result.per_prompt.abs().max() < 1e-5
        assert abs(result.total_effect) < 1e-6


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_reference_end_logits_are_the_models_own(arch: str) -> None:
    """END-only readout = the CausalLM's full logits at END (gemma2's soft-cap included), on right-padded rows."""
    view = view_of(arch)
    batch = random_batch(int(view.dims.d_vocab), [7, 5, 9, 7])
    with torch.no_grad():
        full = view.model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask).logits  # [batch, pos, d_vocab]
        at_end = end_logits(view.model, batch.ref_ids, batch.ref_mask, batch.end)  # [batch, d_vocab]
    torch.testing.assert_close(at_end, full[torch.arange(len(batch.end)), batch.end], atol=1e-5, rtol=1e-5)


def test_reference_unembeds_end_rows_only() -> None:
    """The loop baseline must not project every position onto the vocabulary: the fast engine does not."""
    view = view_of("gemma2")
    batch = answered_batch(view, [7, 5, 9, 7])
    rows_unembedded: list[tuple[int, ...]] = []
    record = (view.model.get_output_embeddings(), lambda _m, args: rows_unembedded.append(tuple(args[0].shape)))
    with hooks(pre=[record]):
        ReferencePatcher(view, batch).effect(Component(1, 2), "path")
    assert rows_unembedded == [(4, view.dims.d_model)] * 3  # reference, counterfactual, one patched pass
