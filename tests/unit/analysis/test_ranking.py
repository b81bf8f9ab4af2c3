"""Effects that are undefined: a share of a zero whole-prompt effect (null, and the fraction rule refused), and
a relative change over an answer logit of 0 or not finite (refused, naming the prompts)."""

from __future__ import annotations

import json

import pytest
import torch

from arithmech.analysis.ranking import rank_components
from arithmech.data import PromptPair
from arithmech.errors import DataError
from arithmech.models.sites import Component
from arithmech.patching.path import PatchResult
from arithmech.stages.identify import check_finite

COMPONENTS = [Component(0, 0), Component(0, 1), Component(0)]


def test_share_of_a_zero_whole_prompt_effect_is_null() -> None:
    key = rank_components(COMPONENTS, [-1e-8, 0.0, 2e-9], total_effect=0.0)
    assert all(r.fraction_of_total is None for r in key.ranked)
    text = json.dumps(key.to_json(), allow_nan=False)  # valid JSON: null, not a bare NaN
    assert json.loads(text)["top_k"][0]["fraction_of_total"] is None
    with pytest.raises(DataError, match="whole-prompt counterfactual effect is 0.*--threshold instead"):
        rank_components(COMPONENTS, [-1e-8, 0.0, 2e-9], total_effect=0.0, fraction_threshold=0.1)


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf")])
def test_an_undefined_effect_is_refused_naming_the_prompt(bad: float) -> None:
    pairs = [PromptPair(f"{i} + 1 = ", f"{i} @ 1 = ", str(i + 1), source="p.jsonl", line=i + 2) for i in range(3)]
    ref = torch.tensor([2.0, bad, 3.0])
    cf = torch.tensor([1.0, 1.0, 2.0])
    per_prompt = (torch.ones(len(COMPONENTS), 3) - ref) / ref.abs()  # [component, batch]
    patch = PatchResult(COMPONENTS, per_prompt, ref, cf, "path")
    with pytest.raises(DataError, match=r"prompt file p\.jsonl, line 3 \(1 of 3 pairs\): the path patching effect"):
        check_finite(patch, pairs)
    check_finite(PatchResult(COMPONENTS, per_prompt[:, [0, 2]], ref[[0, 2]], cf[[0, 2]], "path"), [pairs[0], pairs[2]])


@pytest.mark.parametrize(
    ("effects", "total", "fraction", "said"),
    [
        ([-0.04, -0.01, 0.0], -0.06, None, "strongest effect is -4.00% (0.0), not below the threshold -5.00%; give a "
                                           "threshold nearer 0, e.g. --threshold -0.02"),
        ([-0.004, -0.001, 0.0], -0.06, 0.1, "largest share of the whole-prompt effect is 0.067 (0.0), below "
                                            "--fraction-threshold 0.1; give a lower one, e.g. --fraction-threshold "
                                            "0.033"),
        ([0.01, 0.02, 0.0], -0.06, None, "no component lowers the answer's logit"),
        ([-0.01, 0.02, 0.0], 0.03, 0.1, "whole-prompt counterfactual effect is +3.00%, so no component"),
    ],
)  # fmt: skip
def test_no_key_component_says_why_and_what_to_change(
    effects: list[float], total: float, fraction: float | None, said: str
) -> None:
    """Issue 34.1: an empty key list names the strongest effect against the rule and the option to change."""
    key = rank_components(COMPONENTS, effects, total_effect=total, fraction_threshold=fraction)
    assert key.key == [] and key.why_none is not None and said in key.why_none, key.why_none
    assert key.to_json()["why_none"] == key.why_none
    found = rank_components(COMPONENTS, [-0.1, 0.0, 0.0], total_effect=-0.2)
    assert found.why_none is None and found.to_json()["why_none"] is None
