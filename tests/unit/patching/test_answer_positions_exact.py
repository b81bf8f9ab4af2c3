"""Per-digit path patching (answers scored token by token) equals the naive one-forward-per-component reference
on prompts built independently from the text, on every tiny architecture; the per-position tables are its means."""

from __future__ import annotations

import pytest
import torch

from arithmech.analysis.agreement import top_k_overlap
from arithmech.analysis.answer_positions import position_effects, position_overlap
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


PAIRS = [pair(27, 15), pair(3, 4), pair(95, 17), pair(21, 15), pair(42, 15, "subtraction"), pair(47, 15, "subtraction")]


def naive_batch(tokenizer, pairs: list[PromptPair]) -> tuple[PatchingBatch, list[int]]:
    """Row per answer character (one token each on the byte tokenizer), tokenized from the text itself:
    prompt + the answer's first j - 1 characters, the counterfactual with the same characters; and positions."""
    rows, positions = [], []
    for p in pairs:
        for j, digit in enumerate(p.answer):
            ref = tokenizer(p.reference + p.answer[:j])["input_ids"]
            cf = tokenizer(p.counterfactual + p.answer[:j])["input_ids"]
            rows.append((ref, cf, tokenizer(digit)["input_ids"][0]))
            positions.append(j + 1)
    width = max(len(r) for r, _, _ in rows)
    ref_ids = torch.zeros(len(rows), width, dtype=torch.long)
    cf_ids, mask = ref_ids.clone(), ref_ids.clone()
    for i, (ref, cf, _) in enumerate(rows):
        ref_ids[i, : len(ref)], cf_ids[i, : len(cf)], mask[i, : len(ref)] = torch.tensor(ref), torch.tensor(cf), 1
    answers = torch.tensor([a for _, _, a in rows])
    return PatchingBatch(ref_ids, mask, cf_ids, mask.clone(), mask.sum(1) - 1, answers), positions


@pytest.mark.parametrize("variant", ["path", "direct", "total"])
@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_per_digit_scan_equals_naive_reference(arch: str, variant: str) -> None:
    model = make_tiny_model(arch, seed=0)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    tokenizer = make_tiny_tokenizer()
    t, _ = tokenize_pairs(tokenizer, PAIRS, answer_digits=True)
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    fast = path_patch(view, batch, variant=variant, batch_size=4)
    naive, positions = naive_batch(tokenizer, PAIRS)
    assert t.answer_position.tolist() == positions
    reference = ReferencePatcher(view, naive)
    torch.testing.assert_close(fast.ref_logit, reference.ref_logit.cpu(), atol=1e-5, rtol=1e-5)
    expected = torch.stack([reference.effect(c, variant) for c in all_components(view.dims)])  # [component, row]
    scale = reference.ref_logit.abs().cpu()  # compare patched - ref: a logit near 0 blows the relative change up
    torch.testing.assert_close(fast.per_prompt * scale, expected * scale, atol=1e-5, rtol=1e-4)
    assert (expected * scale).abs().max() > 1e-3, "effects are all ~0: the test could not tell variants apart"

    rows = position_effects(fast, t)
    position = torch.tensor(positions)
    for p in (1, 2, 3):
        at = [r for r in rows if r["position"] == p and r["group"] == "all"]
        assert [float(r["effect"]) for r in at] == pytest.approx(fast.per_prompt[:, position == p].mean(1).tolist())
        assert {r["prompts"] for r in at} == {int((position == p).sum())}
    carry = [r for r in rows if r["position"] == 1 and r["group"] == "carry"]
    is_carry = torch.tensor([pr.a in ("27", "95") for pr in t.pairs]) & (position == 1)  # 27+15, 95+17 carry
    assert [float(r["effect"]) for r in carry] == pytest.approx(fast.per_prompt[:, is_carry].mean(1).tolist())
    assert {r["group"] for r in rows} == {"all", "carry", "no carry", "borrow", "no borrow"}
    overlap = {(r["position_a"], r["position_b"]): r for r in position_overlap(fast, t, ks=(3,))}
    mean = {p: fast.per_prompt[:, position == p].mean(1) for p in (1, 2)}
    assert float(overlap[(1, 2)]["top3_overlap"]) == pytest.approx(top_k_overlap(mean[1], mean[2], 3), abs=1e-4)
