"""GPT-2: LayerNorm, fused c_attn with [Q | K | V] outputs, and Conv1D weights stored as (in, out)."""

from arithmech.models.spec import ArchSpec

GPT2 = ArchSpec(
    name="gpt2",
    model_types=("gpt2",),
    layers="transformer.h",
    final_norm="transformer.ln_f",
    qkv_proj="attn.c_attn",
    qkv_layout="concat",
    o_proj="attn.c_proj",
    attn="attn",
    attn_norm="ln_1",
    mlp="mlp",
    down_proj="mlp.c_proj",
    mlp_norm="ln_2",
    conv1d=True,
    n_heads_attr=("n_head",),
)
