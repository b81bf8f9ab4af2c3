"""Llama-style blocks (RMSNorm, separate q/k/v/o, gated MLP): Llama incl. SmolLM2, Mistral, Qwen2."""

from arithmech.models.spec import ArchSpec

_LLAMA_LIKE = dict(
    layers="model.layers",
    final_norm="model.norm",
    q_proj="self_attn.q_proj",
    k_proj="self_attn.k_proj",
    v_proj="self_attn.v_proj",
    o_proj="self_attn.o_proj",
    attn="self_attn",
    attn_norm="input_layernorm",
    mlp="mlp",
    down_proj="mlp.down_proj",
    mlp_norm="post_attention_layernorm",
)

LLAMA = ArchSpec(name="llama", model_types=("llama",), **_LLAMA_LIKE)
MISTRAL = ArchSpec(name="mistral", model_types=("mistral",), **_LLAMA_LIKE)
QWEN2 = ArchSpec(name="qwen2", model_types=("qwen2",), **_LLAMA_LIKE)
