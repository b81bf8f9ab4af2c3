"""Two-digit sums digit by digit on the real default model: the heads that matter most for the tens digit and for
the units digit are different heads, each needed more at its own place (README, per-digit circuits).

What is checked is read from the scan this test makes, not from numbers or head names copied from an earlier run:
the top head of each place (most negative mean effect over the rows of that place) must differ between the places,
and its effect at its own place must be clearly larger (more negative) than at the other place.
"""

from __future__ import annotations

import pytest

from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import build_reference_set
from arithmech.models.load import load_model
from arithmech.patching.path import PatchingBatch, path_patch

pytestmark = pytest.mark.default_model

UNITS, TENS = 0, 1
MARGIN = 0.01  # one percentage point of the answer logit: well above float noise, well below the effects seen


def test_the_tens_and_the_units_are_written_by_different_heads() -> None:
    pytest.importorskip("gguf")
    handle = load_model()
    cfg = ReferenceSetConfig(operand_min=10, operand_max=49, n_per_template=8, max_prompts=16, answer_digits=True)
    t = build_reference_set(handle, cfg).tokenized
    assert t.answer_place.tolist() == [TENS, UNITS] * 16  # every sum 20..98 is two tokens, tens first
    patch = path_patch(handle.view, PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids))
    heads = [i for i, c in enumerate(patch.components) if c.head is not None]
    effect = {p: patch.per_prompt[:, t.answer_place == p].mean(1) for p in (UNITS, TENS)}  # [component]
    top = {p: min(heads, key=lambda i: float(effect[p][i])) for p in (UNITS, TENS)}
    names = {p: patch.components[i].name for p, i in top.items()}
    assert top[UNITS] != top[TENS], f"one head ({names[UNITS]}) is the top head of both digits"
    for own, other in ((UNITS, TENS), (TENS, UNITS)):
        at_own, at_other = float(effect[own][top[own]]), float(effect[other][top[own]])
        assert at_own < -MARGIN, (names[own], at_own)  # the top head moves its digit's logit at all
        assert at_own < at_other - MARGIN, (names[own], at_own, at_other)  # and matters more for its own digit
