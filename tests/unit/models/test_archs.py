"""The architecture registry: one spec per name and per model_type, clear errors for the rest."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from arithmech.errors import SpecError
from arithmech.models import archs
from arithmech.models.archs import (
    ARCH_SPECS,
    register_spec,
    spec_for_model_type,
    supported_model_types,
)
from arithmech.models.archs.llama import LLAMA

from tiny_models import TINY_ARCHS

EXPECTED_MODEL_TYPES = {
    "gemma", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "llama", "mistral", "phi3", "qwen2",
}  # fmt: skip


@pytest.fixture
def registry_guard() -> Iterator[None]:
    """Snapshot the global registry; fail if a test changed it, and put it back either way."""
    specs, by_type = dict(ARCH_SPECS), dict(archs._BY_MODEL_TYPE)
    try:
        yield
    finally:
        changed = ARCH_SPECS != specs or archs._BY_MODEL_TYPE != by_type
        ARCH_SPECS.clear()
        ARCH_SPECS.update(specs)
        archs._BY_MODEL_TYPE.clear()
        archs._BY_MODEL_TYPE.update(by_type)
        assert not changed, "a failed registration changed the global registry"


def test_duplicate_name_raises(registry_guard: None) -> None:
    clone = dataclasses.replace(LLAMA, model_types=("brand_new_type",))
    with pytest.raises(SpecError, match="'llama' is already registered"):
        register_spec(clone)
    assert "brand_new_type" not in supported_model_types()


def test_duplicate_model_type_raises(registry_guard: None) -> None:
    clone = dataclasses.replace(LLAMA, name="llama-again", model_types=("brand_new_type", "gpt2"))
    with pytest.raises(SpecError, match="'gpt2' is already served by 'gpt2'"):
        register_spec(clone)
    # nothing half-registered: neither the name nor the model_type listed before the clash
    assert "llama-again" not in ARCH_SPECS
    assert "brand_new_type" not in supported_model_types()
    assert spec_for_model_type("gpt2").name == "gpt2"


def test_unsupported_model_type_lists_supported() -> None:
    with pytest.raises(SpecError) as info:
        spec_for_model_type("bloom")
    message = str(info.value)
    assert "'bloom' is not supported" in message
    for model_type in EXPECTED_MODEL_TYPES:
        assert model_type in message
    assert "\n" not in message


def test_supported_model_types() -> None:
    types = supported_model_types()
    assert types == sorted(types)
    assert set(types) == EXPECTED_MODEL_TYPES
    for model_type in types:
        assert model_type in spec_for_model_type(model_type).model_types


def test_names_and_model_types_are_unique() -> None:
    assert all(name == spec.name for name, spec in ARCH_SPECS.items())
    served = [t for spec in ARCH_SPECS.values() for t in spec.model_types]
    assert len(served) == len(set(served))


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_every_tiny_arch_has_a_spec(arch: str) -> None:
    model_type = TINY_ARCHS[arch]().model_type
    spec = spec_for_model_type(model_type)
    assert model_type in spec.model_types


@pytest.mark.parametrize("spec", sorted(ARCH_SPECS.values(), key=lambda s: s.name), ids=lambda s: s.name)
def test_specs_are_consistent(spec) -> None:
    """Separate layouts name q/k/v and no fused projection; fused layouts the reverse."""
    if spec.qkv_layout == "separate":
        assert spec.q_proj and spec.k_proj and spec.v_proj and spec.qkv_proj is None
    else:
        assert spec.qkv_proj and not (spec.q_proj or spec.k_proj or spec.v_proj)
    assert (spec.attn_out_norm is None) == (spec.mlp_out_norm is None)
