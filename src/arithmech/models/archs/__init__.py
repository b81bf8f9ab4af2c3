"""The registry of supported architectures: one declarative spec per family, looked up by model_type."""

from __future__ import annotations

from arithmech.errors import SpecError
from arithmech.models.archs.gemma import GEMMA, GEMMA2, GEMMA3
from arithmech.models.archs.gpt2 import GPT2
from arithmech.models.archs.gpt_neox import GPT_NEOX
from arithmech.models.archs.llama import LLAMA, MISTRAL, QWEN2
from arithmech.models.archs.phi3 import PHI3
from arithmech.models.spec import ArchSpec

__all__ = ["ARCH_SPECS", "register_spec", "spec_for_model_type", "supported_model_types"]

ARCH_SPECS: dict[str, ArchSpec] = {}
_BY_MODEL_TYPE: dict[str, ArchSpec] = {}


def register_spec(spec: ArchSpec) -> ArchSpec:
    """Add a spec to the registry; a second spec for the same name or model_type is an error."""
    if spec.name in ARCH_SPECS:
        raise SpecError(f"an architecture named {spec.name!r} is already registered; pick another name")
    for model_type in spec.model_types:
        if model_type in _BY_MODEL_TYPE:
            raise SpecError(
                f"model_type {model_type!r} is already served by {_BY_MODEL_TYPE[model_type].name!r}; "
                "remove it from one of the two specs"
            )
    ARCH_SPECS[spec.name] = spec
    for model_type in spec.model_types:
        _BY_MODEL_TYPE[model_type] = spec
    return spec


for _spec in (LLAMA, MISTRAL, QWEN2, GEMMA, GEMMA2, GEMMA3, GPT2, GPT_NEOX, PHI3):
    register_spec(_spec)


def supported_model_types() -> list[str]:
    """All config.model_type values with a spec, sorted."""
    return sorted(_BY_MODEL_TYPE)


def spec_for_model_type(model_type: str) -> ArchSpec:
    """The spec serving `model_type`, or a SpecError naming what is supported."""
    try:
        return _BY_MODEL_TYPE[model_type]
    except KeyError:
        raise SpecError(
            f"architecture {model_type!r} is not supported; supported model types are: "
            f"{', '.join(supported_model_types())} (adding one is a spec in arithmech/models/archs/)"
        ) from None
