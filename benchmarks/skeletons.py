"""Skeletons: random-init models with the published widths of `arithmech plan`'s presets, cut to a few layers.

A skeleton keeps everything of its preset (src/arithmech/plan/presets.py) that sets the size of a tensor: hidden
size, query and key-value heads and their width, MLP width, vocabulary, tied or untied unembedding, q/k/v biases,
Gemma 2's sandwich norms; only `n_layers` is cut (to 2 and 4 by default). Memory per layer and per prompt is then
that of the full model, which the plan's per-layer term extrapolates, without loading 7B weights.

`--quick` shrinks the widths instead (`quick_shape`), keeping each preset's proportions: query heads per key-value
head, d_model against n_heads x d_head (Gemma 2's differ), the MLP ratio and the tied embedding, at a size a unit test
runs in seconds. Every skeleton reads tokens of the byte-level test tokenizer (tests/tiny_models.py: one token a
byte, ids below 258), which every vocabulary holds, so prompts cost the same tokens on every preset.

Weights follow tests/tiny_models.py's widened init (gain 1.5 / sqrt(fan_in)), so that effects and scores are far from
zero, as in a trained model, and numerics compare numbers that matter.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from arithmech.models.archs import spec_for_model_type  # noqa: E402
from arithmech.models.load import DTYPES, ModelHandle  # noqa: E402
from arithmech.models.view import ModelView  # noqa: E402
from arithmech.plan.presets import preset  # noqa: E402
from arithmech.plan.shape import ModelShape  # noqa: E402

from tiny_models import EOS_ID, PAD_ID, _reinit_, make_tiny_tokenizer, seeded_rng  # noqa: E402

SKELETON_PRESETS = ("llama2-7b", "llama3.1-8b", "mistral-7b", "qwen2.5-7b", "gemma2-9b")
"""The presets of the paper's models and their neighbours (the default model is small enough to measure whole)."""
MAX_POSITIONS = 4096
"""Rotary tables of this length (no weights); the longest prompt a stage builds here is a few hundred tokens."""
QUICK_D_HEAD = 8
"""--quick: width of a 128-wide head (a 256-wide one, Gemma 2's, gets twice it)."""
QUICK_MIN_VOCAB = 320
"""--quick: the smallest vocabulary, above the test tokenizer's 258 tokens."""


def skeleton_shape(name: str, n_layers: int, quick: bool = False) -> ModelShape:
    """The preset's shape cut to `n_layers` (with `quick`, also shrunk: `quick_shape`)."""
    shape = dataclasses.replace(preset(name), n_layers=n_layers)
    shape = quick_shape(shape) if quick else shape
    return dataclasses.replace(shape, name=f"{name} x {n_layers} layers" + (" (quick)" if quick else ""))


def quick_shape(shape: ModelShape) -> ModelShape:
    """A small shape of the same proportions: key-value heads / 8 (at least 1) with the preset's query heads per
    key-value head, heads of d_head / 16, d_model and the MLP scaled by the heads' total width, vocabulary / 256."""
    n_kv = max(1, shape.n_kv_heads // 8)
    n_heads = n_kv * shape.group_size
    d_head = QUICK_D_HEAD * shape.d_head // 128
    scale = n_heads * d_head / (shape.n_heads * shape.d_head)
    d_model = 2 * round(shape.d_model * scale / 2)
    return dataclasses.replace(
        shape, n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head, d_model=d_model,
        d_mlp=round(shape.d_mlp * d_model / shape.d_model), d_vocab=max(QUICK_MIN_VOCAB, shape.d_vocab // 256),
    )  # fmt: skip


def hf_config(shape: ModelShape) -> Any:
    """The transformers config of `shape`'s family, eager attention (models/load.py's, which the plan assumes)."""
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    common: dict[str, Any] = {
        "hidden_size": shape.d_model, "intermediate_size": shape.d_mlp, "num_hidden_layers": shape.n_layers,
        "num_attention_heads": shape.n_heads, "num_key_value_heads": shape.n_kv_heads, "head_dim": shape.d_head,
        "vocab_size": shape.d_vocab, "tie_word_embeddings": shape.tied_embeddings,
        "max_position_embeddings": MAX_POSITIONS, "pad_token_id": PAD_ID, "eos_token_id": EOS_ID,
        "bos_token_id": None, "attn_implementation": "eager", "use_cache": False,
    }  # fmt: skip
    if shape.model_type == "gemma2":
        layers = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(shape.n_layers)]
        return Gemma2Config(**common, query_pre_attn_scalar=shape.d_head, layer_types=layers)
    if shape.model_type == "qwen2":
        return Qwen2Config(**common)
    if shape.model_type == "mistral":
        return MistralConfig(**common, sliding_window=None)
    return LlamaConfig(**common)


def build_skeleton(shape: ModelShape, dtype: str, seed: int = 0, device: str = "cpu") -> Any:
    """The random-init model of `shape` in `dtype` on `device`, in eval mode, the global RNG left as it was."""
    from transformers import AutoModelForCausalLM

    with seeded_rng(seed), torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(shape), dtype=DTYPES[dtype])
        _reinit_(model)
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    return model.eval()


def skeleton_handle(model: Any, name: str) -> ModelHandle:
    """A stage's handle on a skeleton: the model, the test tokenizer, its view."""
    tokenizer = make_tiny_tokenizer()
    tokenizer.model_max_length = MAX_POSITIONS
    spec = spec_for_model_type(model.config.model_type)
    return ModelHandle(model, tokenizer, ModelView(model, spec), {"model": name, "skeleton": True})

