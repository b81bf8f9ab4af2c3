"""Gemma families. Gemma 2 and 3 norm the attention and MLP outputs before the residual add ("sandwich"
norms), Gemma 2 soft-caps the final logits, and Gemma 3 may have heads x head_dim != hidden size."""

from arithmech.models.spec import ArchSpec

_GEMMA_BASE = dict(
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
)

GEMMA = ArchSpec(name="gemma", model_types=("gemma",), mlp_norm="post_attention_layernorm", **_GEMMA_BASE)

_SANDWICH = dict(
    mlp_norm="pre_feedforward_layernorm",
    attn_out_norm="post_attention_layernorm",
    mlp_out_norm="post_feedforward_layernorm",
    logit_softcap_attr="final_logit_softcapping",
)

GEMMA2 = ArchSpec(name="gemma2", model_types=("gemma2",), **_SANDWICH, **_GEMMA_BASE)
GEMMA3 = ArchSpec(name="gemma3", model_types=("gemma3_text",), **_SANDWICH, **_GEMMA_BASE)
