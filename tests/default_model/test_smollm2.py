"""The real built-in default model (SmolLM2-135M-Instruct): exactness on a few components and behaviour.

Marked `default_model`; part of `make test`. The first run converts the GGUF file (~45 s) into the cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from arithmech.cli import main
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import build_reference_set
from arithmech.models.load import ModelHandle, default_cache_dir, load_model
from arithmech.models.sites import all_components, parse_components
from arithmech.patching.path import PatchingBatch, path_patch

from reference_patching import ReferencePatcher

pytestmark = pytest.mark.default_model


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    pytest.importorskip("gguf")
    return load_model()


@pytest.fixture(scope="module")
def small_set(handle: ModelHandle):
    cfg = ReferenceSetConfig(formations=("equation",), n_per_template=4, max_prompts=8)
    reference = build_reference_set(handle, cfg)
    return reference.tokenized, reference.template_accuracy, reference.counts


def test_default_model_shape_and_cache(handle: ModelHandle) -> None:
    dims = handle.dims
    assert (dims.n_layers, dims.n_heads, dims.n_kv_heads, dims.d_head) == (30, 9, 3, 64)
    assert handle.spec.name == "llama"
    cached = Path(handle.source["loaded_from"])
    assert cached.parent == default_cache_dir() and (cached / "config.json").exists()
    assert len(handle.source["gguf_sha256"]) == 64


def test_digits_are_single_tokens(handle: ModelHandle) -> None:
    tokens = handle.tokenizer.convert_ids_to_tokens(handle.tokenizer("12 + 34 = ").input_ids)
    assert tokens == ["1", "2", "Ġ+", "Ġ", "3", "4", "Ġ=", "Ġ"]  # one token per digit, the space apart


def test_few_shot_addition_is_answered(small_set) -> None:
    _, accuracy, counts = small_set
    assert counts["answered_correctly"] / (counts["pairs"] - counts["rejected_length_mismatch"]) >= 0.5
    assert counts["used"] == 8


def test_fast_equals_reference_on_real_model(handle: ModelHandle, small_set) -> None:
    t, _, _ = small_set
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    fast = path_patch(handle.view, batch, "path", batch_size=8)
    reference = ReferencePatcher(handle.view, batch)
    order = all_components(handle.dims)
    for component in parse_components("14.2,18.5,0.0,29.8,mlp.19,mlp.29", handle.dims):
        expected = reference.effect(component, "path")
        torch.testing.assert_close(fast.per_prompt[order.index(component)], expected, atol=1e-5, rtol=1e-4)
    assert fast.total_effect < 0, "the operator counterfactual should lower the answer logit"
    assert float(fast.effects.min()) < -0.005


def test_identify_cli_on_default_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["identify", "--formations", "equation", "--n-per-template", "2", "--max-prompts", "4",
                 "--out", str(out), "--quiet"])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "top heads:" in stdout and "top MLPs:" in stdout
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["model"]["model"] == "SmolLM2-135M-Instruct"
    assert metadata["dims"]["n_layers"] == 30
    assert len((out / "effects.csv").read_text().splitlines()) == 1 + 30 * 10
