"""ArchSpec: where one family of Hugging Face decoder models keeps each part, as data.

Every stage reads a model through the same small set of sites: the input of the attention output projection
(split by head), the attention module (whose second output is the attention pattern), the attention and MLP
outputs, the MLP's down projection (whose input is the neurons), the norms around them and the final norm; the
unembedding is the model's own `get_output_embeddings()`.
A family's spec says only where those modules live and how their weights are laid out; `models/view.py`
turns a spec plus a loaded model into tensors. Adding an architecture means writing one spec in
`models/archs/` and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

QKVLayout = Literal["separate", "concat", "interleaved"]


@dataclass(frozen=True)
class ArchSpec:
    """Module paths (dotted, relative to the block unless said otherwise) and weight layout of one family."""

    name: str
    """Family name shown to users, e.g. "llama"."""
    model_types: tuple[str, ...]
    """Values of `config.model_type` this spec serves."""
    layers: str
    """ModuleList of decoder blocks, from the CausalLM root (e.g. "model.layers")."""
    final_norm: str
    """Final norm, from the root."""
    o_proj: str
    """Attention output projection; its input is the per-head outputs concatenated."""
    attn_norm: str
    """Norm before attention; its input is the residual stream entering the block."""
    mlp: str
    """The MLP module (position-wise)."""
    down_proj: str
    """The MLP's down projection (e.g. "mlp.down_proj"); its input is the neuron activations [..., d_mlp]."""
    mlp_norm: str
    """Norm before the MLP; its input is the residual the MLP reads."""
    attn: str
    """The attention module; under eager attention it returns (attn_output, weights [batch, head, q, k])."""
    q_proj: str | None = None
    k_proj: str | None = None
    v_proj: str | None = None
    qkv_proj: str | None = None
    """Fused Q/K/V projection, when the family has one instead of q/k/v_proj."""
    qkv_layout: QKVLayout = "separate"
    """"concat": [Q | K | V] blocks along the output; "interleaved": per head [q_h | k_h | v_h] (GPT-NeoX)."""
    attn_out_norm: str | None = None
    """Norm applied to the attention output before it joins the residual (Gemma 2/3)."""
    mlp_out_norm: str | None = None
    """Norm applied to the MLP output before it joins the residual (Gemma 2/3)."""
    conv1d: bool = False
    """Weights stored as (in, out), GPT-2's Conv1D, instead of nn.Linear's (out, in)."""
    parallel_residual: bool | str = False
    """Attention and MLP both read the block input (GPT-NeoX); a string names the config flag that says so."""
    n_heads_attr: tuple[str, ...] = ("num_attention_heads",)
    """Config attributes holding the number of query heads, first found wins."""
    n_kv_heads_attr: tuple[str, ...] = ("num_key_value_heads",)
    """Config attributes holding the number of key/value heads; absent means one per query head."""
    logit_softcap_attr: str | None = None
    """Config attribute of a final logit soft-cap, tanh(x / c) * c (Gemma 2)."""
