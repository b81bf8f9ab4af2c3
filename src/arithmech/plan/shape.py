"""A model's shape: the sizes a memory and time plan needs, and the parameter count they imply.

`ModelShape` is what `arithmech plan` knows of a model; it never holds a weight. Its sizes use TransformerLens's
vocabulary (`n_layers`, `d_model`, `n_heads`, `n_kv_heads`, `d_head`, `d_mlp`, `d_vocab`). The parameter count
is that of a Hugging Face decoder of the family:

    embed      d_vocab x d_model                      (+ n_positions x d_model for learned positions, GPT-2)
    per layer  d_model x (n_heads + 2 n_kv_heads) x d_head  + n_heads x d_head x d_model      q, k, v; o
               mlp_matrices x d_model x d_mlp                                                  gate, up, down
               norms_per_layer x d_model                                                       norm weights
               (n_heads + 2 n_kv_heads) x d_head with q/k/v biases (Qwen2); GPT-2's biases likewise
    final      d_model (final norm) + d_vocab x d_model when the unembedding is not tied to the embedding
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from arithmech.errors import ConfigError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per number of each dtype a model runs in (`--dtype`)."""


def plan_dtype(dtype: str, checkpoint: str | None) -> str:
    """The dtype a plan counts in: `auto` is the checkpoint's own (float32 when it names none we know)."""
    if dtype == "auto":
        return checkpoint if checkpoint in DTYPE_BYTES else "float32"
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join([*DTYPE_BYTES, 'auto'])}")
    return dtype


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder LM, and where they were read."""

    name: str
    model_type: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    tied_embeddings: bool
    mlp_matrices: int = 3
    """3 for a gated MLP (gate, up, down), 2 for GPT-2's (fc, proj)."""
    norms_per_layer: int = 2
    """4 for Gemma 2/3's sandwich norms."""
    qkv_bias: bool = False
    linear_bias: bool = False
    """Every linear layer has a bias (GPT-2)."""
    n_positions: int = 0
    """Learned position embeddings (GPT-2); 0 with rotary embeddings."""
    logit_softcap: bool = False
    """The logits pass through cap * tanh(logits / cap) (Gemma 2's final_logit_softcapping)."""
    dtype: str | None = None
    """The checkpoint's own dtype (config.json torch_dtype), used for --dtype auto."""
    context: int | None = None
    """The longest sequence the model takes (max_position_embeddings): no stage runs a wider prompt."""
    source: str = ""

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def n_params(self) -> int:
        """Parameters of the whole model (module docstring)."""
        d, qkv = self.d_model, (self.n_heads + 2 * self.n_kv_heads) * self.d_head
        layer = d * qkv + self.n_heads * self.d_head * d + self.mlp_matrices * d * self.d_mlp
        layer += self.norms_per_layer * d * (2 if self.linear_bias else 1)
        if self.qkv_bias or self.linear_bias:
            layer += qkv
        if self.linear_bias:
            layer += d + self.d_mlp * (self.mlp_matrices - 1) + d
        embed = self.d_vocab * d + self.n_positions * d
        final = d * (2 if self.linear_bias else 1) + (0 if self.tied_embeddings else self.d_vocab * d)
        return embed + self.n_layers * layer + final

    def layer_params(self) -> int:
        """Parameters of one decoder layer."""
        one = ModelShape(**{**asdict(self), "n_layers": 1})
        none = ModelShape(**{**asdict(self), "n_layers": 0})
        return one.n_params - none.n_params

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n_params": self.n_params}
