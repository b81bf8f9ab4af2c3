"""GPT-NeoX (Pythia): fused query_key_value laid out per head, and attention and MLP in parallel when
config.use_parallel_residual is set (both read the block input)."""

from arithmech.models.spec import ArchSpec

GPT_NEOX = ArchSpec(
    name="gpt-neox",
    model_types=("gpt_neox",),
    layers="gpt_neox.layers",
    final_norm="gpt_neox.final_layer_norm",
    qkv_proj="attention.query_key_value",
    qkv_layout="interleaved",
    o_proj="attention.dense",
    attn="attention",
    attn_norm="input_layernorm",
    mlp="mlp",
    down_proj="mlp.dense_4h_to_h",
    mlp_norm="post_attention_layernorm",
    parallel_residual="use_parallel_residual",
)
