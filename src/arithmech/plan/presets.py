"""The published shapes of the models of the paper and its neighbours, and of the built-in default model.

Each is the model's config.json on the Hugging Face hub (the sizes `arithmech plan` needs), in its release dtype:
    llama2-7b      meta-llama/Llama-2-7b-hf             32 x 4096, 32 heads, MLP 11008, vocabulary 32000
    llama3.1-8b    meta-llama/Llama-3.1-8B              32 x 4096, 32 heads / 8 key-value heads (GQA), MLP 14336,
                                                        vocabulary 128256
    mistral-7b     mistralai/Mistral-7B-v0.1            32 x 4096, 32 / 8 heads, MLP 14336, vocabulary 32000
    qwen2.5-7b     Qwen/Qwen2.5-7B                      28 x 3584, 28 / 4 heads, MLP 18944, vocabulary 152064,
                                                        q/k/v biases
    gemma2-9b      google/gemma-2-9b                    42 x 3584, 16 / 8 heads of 256, MLP 14336, vocabulary
                                                        256000, tied embeddings, sandwich norms
    smollm2-135m   HuggingFaceTB/SmolLM2-135M-Instruct  30 x 576, 9 / 3 heads, MLP 1536, vocabulary 49152, tied
                                                        (the built-in default, dequantized to float32)
"""

from __future__ import annotations

from arithmech.errors import ConfigError
from arithmech.plan.shape import ModelShape

PRESETS: dict[str, ModelShape] = {
    "llama2-7b": ModelShape("llama2-7b", "llama", 32, 4096, 32, 32, 128, 11008, 32000, False, dtype="float16",
                            source="preset: meta-llama/Llama-2-7b-hf"),
    "llama3.1-8b": ModelShape("llama3.1-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, False, dtype="bfloat16",
                              source="preset: meta-llama/Llama-3.1-8B"),
    "mistral-7b": ModelShape("mistral-7b", "mistral", 32, 4096, 32, 8, 128, 14336, 32000, False, dtype="bfloat16",
                             source="preset: mistralai/Mistral-7B-v0.1"),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, False, qkv_bias=True,
                             dtype="bfloat16", source="preset: Qwen/Qwen2.5-7B"),
    "gemma2-9b": ModelShape("gemma2-9b", "gemma2", 42, 3584, 16, 8, 256, 14336, 256000, True, norms_per_layer=4,
                            logit_softcap=True, dtype="float32", source="preset: google/gemma-2-9b"),
    "smollm2-135m": ModelShape("smollm2-135m", "llama", 30, 576, 9, 3, 64, 1536, 49152, True, dtype="float32",
                               source="preset: HuggingFaceTB/SmolLM2-135M-Instruct"),
}  # fmt: skip
"""Preset name -> shape (module docstring)."""


def preset(name: str) -> ModelShape:
    """The preset's shape, or one sentence listing the presets."""
    shape = PRESETS.get(name.lower())
    if shape is None:
        raise ConfigError(f"unknown preset {name!r}; the presets are {', '.join(PRESETS)}")
    return shape
