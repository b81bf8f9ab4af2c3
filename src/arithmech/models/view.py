"""ModelView: one view of any supported architecture, so that no stage knows a model family.

It resolves an `ArchSpec` against a loaded model and gives every stage the same sites and tensors:

- per-head outputs: the o_proj input [..., head * d_head] split by head and multiplied by that head's
  block of W_O, so that sum over heads (+ o_proj bias) = attention output (a tested identity);
- per-head Q/K/V/O weight slices (grouped-query attention maps query head h to kv head h // (H / H_kv));
- the MLP's contribution to the residual from the residual it reads, and the attention's from its output
  (Gemma 2/3 norm both before the add);
- the readout of a residual vector: final norm, raw unembedding rows, bias and soft-cap, as the model does
  but always in float32 (float64 for a float64 model): in bfloat16 a logit near 20 moves in steps of 0.125,
  as large as the head effects that path patching ranks. Every score and both sides of every difference
  (reference and patched logit, intact and knocked-out probability) go through this one readout.

d_head is read from the weights (o_proj input width / heads), never assumed to be d_model / heads.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from arithmech.errors import SpecError
from arithmech.models.hooks import hooks
from arithmech.models.spec import ArchSpec

_CAST_ELEMENTS = 2**24
"""Most unembedding numbers cast to float32 at once by `ModelView.vocab_logits` (64 MiB)."""


@dataclass(frozen=True)
class Dims:
    """Sizes of a model, in TransformerLens's vocabulary."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_vocab: int

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads


@dataclass(frozen=True)
class WeightSlice:
    """The part of a projection's weight (and bias) that belongs to one head."""

    module: nn.Module
    dim: int
    """Weight dimension the slice indexes: 0 = nn.Linear output rows or Conv1D input rows, 1 = the other."""
    index: slice
    has_bias: bool
    """Whether the bias shares the slice (true for output-side slices of Q/K/V)."""

    def weight(self) -> torch.Tensor:
        w = self.module.weight
        return w[self.index] if self.dim == 0 else w[:, self.index]

    def bias(self) -> torch.Tensor | None:
        b = getattr(self.module, "bias", None)
        return b[self.index] if (b is not None and self.has_bias) else None


def cache_kwarg(model: nn.Module) -> str:
    """Name of the key/value cache argument of `model.forward`: `cache` in transformers 5.x, else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def forward_in_dtype(module: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """module(x) computed in `dtype`: x and the module's parameters are cast for this call only.

    A bfloat16 norm read in float32 this way works for every family (nn.LayerNorm refuses mixed dtypes), and
    the cast copy of the parameters is made afresh, so it is never stale after training. The module's hooks run.
    """
    x = x.to(dtype)
    if all(p.dtype == dtype for p in module.parameters()):
        return module(x)
    params = {name: p.to(dtype) for name, p in module.named_parameters()}
    return torch.func.functional_call(module, params, (x,))


def _first_attr(config: object, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


class ModelView:
    """A loaded model seen through its ArchSpec: modules by layer, head-split weights, readout."""

    def __init__(self, model: nn.Module, spec: ArchSpec) -> None:
        self.model = model
        self.spec = spec
        try:
            self.blocks: nn.ModuleList = model.get_submodule(spec.layers)  # type: ignore[assignment]
            self.final_norm = model.get_submodule(spec.final_norm)
            self.unembed = model.get_output_embeddings()
            for path in self._block_paths():
                self.blocks[0].get_submodule(path)
        except AttributeError as err:
            raise SpecError(
                f"the model does not match the {spec.name!r} spec ({err}); "
                "check that the spec's module paths fit this checkpoint"
            ) from None
        config = model.config
        n_heads = _first_attr(config, spec.n_heads_attr)
        if n_heads is None:
            raise SpecError(f"the model config has none of {spec.n_heads_attr}; fix the {spec.name!r} spec")
        n_kv_heads = _first_attr(config, spec.n_kv_heads_attr) or n_heads
        o_in, d_model = self._o_proj_shape(self.o_proj(0))
        if o_in % n_heads or n_heads % n_kv_heads:
            raise SpecError(
                f"o_proj input width {o_in} is not a multiple of {n_heads} heads, or {n_heads} heads "
                f"do not split into {n_kv_heads} key/value groups; this checkpoint does not fit {spec.name!r}"
            )
        self.dims = Dims(
            n_layers=len(self.blocks),
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            d_model=d_model,
            d_head=o_in // n_heads,
            d_vocab=int(self.unembed.weight.shape[0]),
        )
        flag = spec.parallel_residual
        self.parallel_residual = bool(getattr(config, flag, False)) if isinstance(flag, str) else flag
        cap = getattr(config, spec.logit_softcap_attr, None) if spec.logit_softcap_attr else None
        self.logit_softcap: float | None = float(cap) if cap else None

    def _block_paths(self) -> list[str]:
        s = self.spec
        optional = [s.q_proj, s.k_proj, s.v_proj, s.qkv_proj, s.attn_out_norm, s.mlp_out_norm]
        return [s.o_proj, s.attn, s.attn_norm, s.mlp, s.mlp_norm] + [p for p in optional if p]

    def _o_proj_shape(self, o_proj: nn.Module) -> tuple[int, int]:
        """(input width = heads * d_head, output width = d_model) of an o_proj weight."""
        w = o_proj.weight
        return (int(w.shape[0]), int(w.shape[1])) if self.spec.conv1d else (int(w.shape[1]), int(w.shape[0]))

    # -- modules by layer -------------------------------------------------------------------------------
    def module(self, layer: int, path: str) -> nn.Module:
        return self.blocks[layer].get_submodule(path)

    def o_proj(self, layer: int) -> nn.Module:
        return self.module(layer, self.spec.o_proj)

    def attn(self, layer: int) -> nn.Module:
        """The attention module; with eager attention its second output is the pattern [batch, head, q, k]."""
        return self.module(layer, self.spec.attn)

    def attn_norm(self, layer: int) -> nn.Module:
        return self.module(layer, self.spec.attn_norm)

    def mlp(self, layer: int) -> nn.Module:
        return self.module(layer, self.spec.mlp)

    def down_proj(self, layer: int) -> nn.Module:
        """The MLP's down projection, whose input is the neuron activations [..., d_mlp]."""
        return self.module(layer, self.spec.down_proj)

    def mlp_norm(self, layer: int) -> nn.Module:
        return self.module(layer, self.spec.mlp_norm)

    def attn_out_norm(self, layer: int) -> nn.Module | None:
        return self.module(layer, self.spec.attn_out_norm) if self.spec.attn_out_norm else None

    def mlp_out_norm(self, layer: int) -> nn.Module | None:
        return self.module(layer, self.spec.mlp_out_norm) if self.spec.mlp_out_norm else None

    # -- heads --------------------------------------------------------------------------------------------
    def W_O(self, layer: int) -> torch.Tensor:
        """Per-head output blocks [head, d_head, d_model] (a view of the weight, no copy for Conv1D)."""
        d = self.dims
        w = self.o_proj(layer).weight
        w_in_out = w if self.spec.conv1d else w.T  # [head * d_head, d_model]
        return w_in_out.reshape(d.n_heads, d.d_head, d.d_model)  # [head, d_head, d_model]

    def b_O(self, layer: int) -> torch.Tensor | None:
        return getattr(self.o_proj(layer), "bias", None)

    def split_heads(self, z: torch.Tensor) -> torch.Tensor:
        """o_proj input [..., head * d_head] -> [..., head, d_head]."""
        return z.reshape(*z.shape[:-1], self.dims.n_heads, self.dims.d_head)

    def head_outputs(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """Each head's contribution to the attention output: [..., head * d_head] -> [..., head, d_model]."""
        w_o = self.W_O(layer)
        return torch.einsum("...hd,hdm->...hm", self.split_heads(z).to(w_o.dtype), w_o)

    def head_weight_slices(self, layer: int, head: int) -> dict[str, WeightSlice]:
        """The Q, K, V rows and O columns that belong to query head `head` (K/V shared by its kv group)."""
        d, s = self.dims, self.spec
        if not 0 <= head < d.n_heads:
            raise SpecError(f"head {head} does not exist: layer {layer} has heads 0..{d.n_heads - 1}")
        kv = head // d.group_size
        q_idx = slice(head * d.d_head, (head + 1) * d.d_head)
        kv_idx = slice(kv * d.d_head, (kv + 1) * d.d_head)
        out_dim = 1 if s.conv1d else 0
        o_module = self.o_proj(layer)
        slices = {"o": WeightSlice(o_module, 1 - out_dim, q_idx, has_bias=False)}
        if s.qkv_layout == "separate":
            assert s.q_proj and s.k_proj and s.v_proj
            slices["q"] = WeightSlice(self.module(layer, s.q_proj), out_dim, q_idx, True)
            slices["k"] = WeightSlice(self.module(layer, s.k_proj), out_dim, kv_idx, True)
            slices["v"] = WeightSlice(self.module(layer, s.v_proj), out_dim, kv_idx, True)
            return slices
        assert s.qkv_proj
        fused = self.module(layer, s.qkv_proj)
        if s.qkv_layout == "concat":
            k0 = d.n_heads * d.d_head
            v0 = k0 + d.n_kv_heads * d.d_head
            offsets = {"q": (0, q_idx), "k": (k0, kv_idx), "v": (v0, kv_idx)}
        else:  # interleaved per head: [q_h | k_h | v_h] blocks of d_head (GPT-NeoX; no grouped-query)
            base = head * 3 * d.d_head
            offsets = {
                name: (base, slice(i * d.d_head, (i + 1) * d.d_head)) for i, name in enumerate("qkv")
            }
        for name, (start, idx) in offsets.items():
            slices[name] = WeightSlice(fused, out_dim, slice(start + idx.start, start + idx.stop), True)
        return slices

    # -- residual contributions and readout ---------------------------------------------------------------
    def attn_resid(self, layer: int, attn_out: torch.Tensor) -> torch.Tensor:
        """What the attention output adds to the residual stream (after Gemma's post-attention norm)."""
        norm = self.attn_out_norm(layer)
        return norm(attn_out) if norm is not None else attn_out

    def mlp_resid(self, layer: int, mlp_read: torch.Tensor) -> torch.Tensor:
        """What the MLP adds to the residual, from the residual it reads [..., d_model]."""
        out = self.mlp(layer)(self.mlp_norm(layer)(mlp_read))
        norm = self.mlp_out_norm(layer)
        return norm(out) if norm is not None else out

    # -- readout, in float32 whatever the model dtype ------------------------------------------------------
    @property
    def readout_dtype(self) -> torch.dtype:
        """float32 for half-precision and float32 models, float64 for float64 ones."""
        return torch.promote_types(self.final_norm.weight.dtype, torch.float32)

    def normed(self, resid: torch.Tensor) -> torch.Tensor:
        """The final norm of resid [..., d_model], computed in `readout_dtype`, on the unembedding's device.

        The norm module's own forward, its parameters cast for the call (`forward_in_dtype`). Call it outside
        any hook on the final norm: the module's hooks run too.
        """
        norm = self.final_norm
        out = forward_in_dtype(norm, resid.to(norm.weight.device), self.readout_dtype)
        return out.to(self.unembed.weight.device)

    def answer_logits(self, resid: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Logit of token_ids[i] read from the final residual resid[..., i, :], as the model does but in float32.

        resid: [..., batch, d_model], token_ids: [batch] -> [..., batch] float32. The final norm, the
        unembedding rows and bias are applied in `readout_dtype`: a bfloat16 logit near 20 would otherwise
        move in steps of 0.125, as large as the effects that patching ranks.
        """
        normed = self.normed(resid)
        ids = token_ids.to(normed.device)
        rows = self.unembed.weight[ids].to(normed.dtype)  # [batch, d_model]
        logits = (normed * rows).sum(-1)
        bias = getattr(self.unembed, "bias", None)
        if bias is not None:
            logits = logits + bias[ids].to(normed.dtype)
        return self._softcap(logits.float())

    def vocab_logits(self, resid: torch.Tensor, softcap: bool = True) -> torch.Tensor:
        """Full-vocabulary logits of final residuals: [..., d_model] -> [..., d_vocab] in `readout_dtype`.

        Half-precision unembeddings are cast to float32 a block of rows at a time (at most
        `_CAST_ELEMENTS` numbers), so a large vocabulary never needs a whole float32 copy. `softcap=False`
        leaves out the model's final soft-cap (for ranks, which it cannot change but can tie).
        """
        normed = self.normed(resid)
        w = self.unembed.weight  # [d_vocab, d_model]
        if w.dtype == normed.dtype:
            logits = self.unembed(normed)
            return self._softcap(logits) if softcap else logits
        bias = getattr(self.unembed, "bias", None)
        step = max(1, _CAST_ELEMENTS // int(w.shape[1]))
        parts = []
        for start in range(0, int(w.shape[0]), step):
            b = None if bias is None else bias[start : start + step].to(normed.dtype)
            parts.append(torch.nn.functional.linear(normed, w[start : start + step].to(normed.dtype), b))
        logits = torch.cat(parts, dim=-1)  # [..., d_vocab]
        return self._softcap(logits) if softcap else logits

    def _softcap(self, logits: torch.Tensor) -> torch.Tensor:
        if self.logit_softcap is None:
            return logits
        return torch.tanh(logits / self.logit_softcap) * self.logit_softcap

    def final_resid(self, **inputs: Any) -> torch.Tensor:
        """Run the base model on `inputs` (input_ids, attention_mask, cache...) and return the residual entering
        the final norm [batch, pos, d_model], in the model dtype and graph (no gradient is cut)."""
        seen: list[torch.Tensor] = []
        with hooks(pre=[(self.final_norm, lambda _module, args: seen.append(args[0]))]):
            self.model.base_model(**inputs)
        return seen[-1]

    def end_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, end: torch.Tensor
    ) -> torch.Tensor:
        """Full-vocabulary logits at each row's END [batch, d_vocab] float32, read out at END only.

        Runs the base model, takes the residual entering the final norm at END and reads it out with
        `vocab_logits`, which saves the vocabulary projection of every other position.
        """
        device = self.o_proj(0).weight.device
        resid = self.final_resid(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False
        )  # [batch, pos, d_model]
        rows = torch.arange(resid.shape[0], device=resid.device)
        return self.vocab_logits(resid[rows, end.to(resid.device)]).float()  # [batch, d_vocab]
