"""Per-digit path patching (answers scored token by token) equals the naive one-forward-per-component reference
on prompts built independently from the text, on every tiny architecture; the per-place tables are its means over
the rows whose digit is at that place (units, tens, hundreds), counted from the answer's end."""

from __future__ import annotations

import pytest
import torch

from arithmech.analysis.agreement import top_k_overlap
from arithmech.analysis.answer_places import place_effects, place_overlap
from arithmech.data import PromptPair, tokenize_pairs
from arithmech.models.archs import spec_for_model_type
from arithmech.models.sites import all_components
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch, path_patch

from reference_patching import ReferencePatcher
from tiny_models import TINY_ARCHS, make_tiny_model, make_tiny_tokenizer


def pair(a: int, b: int, operation: str = "addition") -> PromptPair:
    op, answer, example = ("+", a + b, "9+1=10") if operation == "addition" else ("-", a - b, "9-1=8")
    return PromptPair(f"{example}\n{a}{op}{b}=", f"{example}\n{a}&{b}=", str(answer), "t", operation, None,
                      str(a), str(b))  # fmt: skip


PAIRS = [pair(27, 15), pair(3, 4), pair(95, 17), pair(21, 15), pair(42, 15, "subtraction"), pair(47, 15, "subtraction"),
         pair(47, 45, "subtraction")]  # answers of 2, 1, 3, 2, 2, 2 and 1 digits


def naive_batch(tokenizer, pairs: list[PromptPair]) -> tuple[PatchingBatch, list[int]]:
    """Row per answer character (one token each on the byte tokenizer), tokenized from the text itself:
    prompt + the answer's first j - 1 characters, the counterfactual with the same characters; and the place of
    each row's digit, counted from the answer's last character (0 units, 1 tens, 2 hundreds)."""
    rows, places = [], []
    for p in pairs:
        for j, digit in enumerate(p.answer):
            ref = tokenizer(p.reference + p.answer[:j])["input_ids"]
            cf = tokenizer(p.counterfactual + p.answer[:j])["input_ids"]
            rows.append((ref, cf, tokenizer(digit)["input_ids"][0]))
            places.append(len(p.answer) - 1 - j)
    width = max(len(r) for r, _, _ in rows)
    ref_ids = torch.zeros(len(rows), width, dtype=torch.long)
    cf_ids, mask = ref_ids.clone(), ref_ids.clone()
    for i, (ref, cf, _) in enumerate(rows):
        ref_ids[i, : len(ref)], cf_ids[i, : len(cf)], mask[i, : len(ref)] = torch.tensor(ref), torch.tensor(cf), 1
    answers = torch.tensor([a for _, _, a in rows])
    return PatchingBatch(ref_ids, mask, cf_ids, mask.clone(), mask.sum(1) - 1, answers), places


@pytest.mark.parametrize("variant", ["path", "direct", "total"])
@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_per_digit_scan_equals_naive_reference(arch: str, variant: str) -> None:
    model = make_tiny_model(arch, seed=0)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    tokenizer = make_tiny_tokenizer()
    t, _ = tokenize_pairs(tokenizer, PAIRS, answer_digits=True)
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    fast = path_patch(view, batch, variant=variant, batch_size=4)
    naive, places = naive_batch(tokenizer, PAIRS)
    assert t.answer_place.tolist() == places
    reference = ReferencePatcher(view, naive)
    torch.testing.assert_close(fast.ref_logit, reference.ref_logit.cpu(), atol=1e-5, rtol=1e-5)
    expected = torch.stack([reference.effect(c, variant) for c in all_components(view.dims)])  # [component, row]
    scale = reference.ref_logit.abs().cpu()  # compare patched - ref: a logit near 0 blows the relative change up
    torch.testing.assert_close(fast.per_prompt * scale, expected * scale, atol=1e-5, rtol=1e-4)
    assert (expected * scale).abs().max() > 1e-3, "effects are all ~0: the test could not tell variants apart"

    rows = place_effects(fast, t)
    place = torch.tensor(places)
    assert [r["place"] for r in rows[:: len(fast.components)] if r["group"] == "all"] == ["units", "tens", "hundreds"]
    for p, name in enumerate(("units", "tens", "hundreds")):
        at = [r for r in rows if r["place"] == name and r["group"] == "all"]
        assert [float(r["effect"]) for r in at] == pytest.approx(fast.per_prompt[:, place == p].mean(1).tolist())
        assert {r["prompts"] for r in at} == {int((place == p).sum())}
    carry = [r for r in rows if r["place"] == "tens" and r["group"] == "carry"]
    is_carry = torch.tensor([pr.a in ("27", "95") for pr in t.pairs]) & (place == 1)  # 27+15, 95+17 carry
    assert [float(r["effect"]) for r in carry] == pytest.approx(fast.per_prompt[:, is_carry].mean(1).tolist())
    assert {r["group"] for r in rows} == {"all", "carry", "no carry", "borrow", "no borrow"}
    overlap = {(r["place_a"], r["place_b"]): r for r in place_overlap(fast, t, ks=(3,))}
    mean = {p: fast.per_prompt[:, place == p].mean(1) for p in (0, 1)}
    assert float(overlap[("units", "tens")]["top3_overlap"]) == pytest.approx(top_k_overlap(mean[0], mean[1], 3),
                                                                              abs=1e-4)  # fmt: skip
