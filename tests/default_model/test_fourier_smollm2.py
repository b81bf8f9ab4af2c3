"""analyze fourier on the real default model (SmolLM2-135M-Instruct): a digit-splitting tokenizer, so the number
index is the ten digits (frequencies 0..5), and cutting every non-constant frequency out of the MLPs (nine
directions of the 576-dimensional residual, at every position) lowers the answer's probability.

Marked `default_model`; the first run converts the GGUF file (~45 s) into the cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from arithmech.models.load import load_model
from arithmech.stages.fourier import analyze_fourier
from arithmech.stages.fourier_config import FourierConfig
from arithmech.stages.identify import IdentifyConfig, identify

pytestmark = pytest.mark.default_model


def test_default_model_digits_and_mlp_low_frequencies(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    handle = load_model()
    run = tmp_path / "run"
    identify(handle, IdentifyConfig(formations=("equation",), n_per_template=2, max_prompts=8), run, quiet=True)
    cfg = FourierConfig(max_prompts=8, filters=("low-pass",), cutoffs=(0,))
    result = analyze_fourier(handle, cfg, run, tmp_path / "fourier", quiet=True)
    numbers = result.metadata["numbers"]
    assert numbers["count"] == 10 and numbers["digit_splitting"] and numbers["max_frequency"] == 5
    assert [label for _, _, label in numbers["tokens"]] == list("0123456789")
    assert result.magnitude["mlp"].shape == (30, 6)
    for row in result.shares:  # every share stands next to a flat spectrum's (5 of 9 dimensions) and random directions'
        assert row["high_frequencies"] == "3-5" and row["flat_share"] == pytest.approx(5 / 9)
        assert 0 < row["high_share"] < 1 and 0 < row["random_mean"] < 1 and row["random_std"] > 0
    assert result.baseline["accuracy"] == 1.0  # identify keeps the prompts the model answers
    cut = {row["component"]: row for row in result.filters}  # low-pass 0: frequencies 1..5 removed
    assert cut["mlp"]["directions"] == 9
    assert cut["mlp"]["answer_prob_change"] < 0
