"""Phi-3: Llama-like blocks with a fused [Q | K | V] projection and a fused gate/up MLP projection."""

from arithmech.models.spec import ArchSpec

PHI3 = ArchSpec(
    name="phi3",
    model_types=("phi3",),
    layers="model.layers",
    final_norm="model.norm",
    qkv_proj="self_attn.qkv_proj",
    qkv_layout="concat",
    o_proj="self_attn.o_proj",
    attn="self_attn",
    attn_norm="input_layernorm",
    mlp="mlp",
    down_proj="mlp.down_proj",
    mlp_norm="post_attention_layernorm",
)
