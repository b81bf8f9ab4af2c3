"""The plain reference for knockout: mean and zero ablation written out by hand, without `arithmech`.

Written to be obviously right rather than fast, and to share no code with the engine it checks (no
`ablation_sources`, `ablation_hooks`, `ablate`, `knockout_scores`, not even `ModelView`):

- each family's module paths are written out in `ATTN_OUT` and `MLP` below;
- activations are captured with hooks registered and removed here;
- a knocked-out head is a forward pre-hook on its layer's attention output projection that overwrites the
  head's d_head slice of that projection's input [batch, pos, head * d_head] (the head's contribution is that
  slice times its block of W_O); a knocked-out MLP is a forward hook that overwrites the MLP's output;
- prompts go in unpadded and of one length per call, so there is no attention mask and END is the last
  position; logits come from the model's own `model(ids).logits`.

The mean-ablation rule is stated once, in `mean_values`: per position, the mean over the counterfactual prompts
of the same template and token length; END only, the mean END value of the whole set. Tests pass whole prompt
sets whose groups all hold at least `MIN_GROUP` prompts, so a minimum group size (a small group falling back to
the END mean) would not change what it computes. Zero ablation is zeros in place of these values.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

ATTN_OUT = {
    "llama": "model.layers.{}.self_attn.o_proj",
    "mistral": "model.layers.{}.self_attn.o_proj",
    "qwen2": "model.layers.{}.self_attn.o_proj",
    "gpt2": "transformer.h.{}.attn.c_proj",
}
"""Per model type: the module whose input is the concatenated head outputs [batch, pos, head * d_head]."""
MLP = {
    "llama": "model.layers.{}.mlp",
    "mistral": "model.layers.{}.mlp",
    "qwen2": "model.layers.{}.mlp",
    "gpt2": "transformer.h.{}.mlp",
}
"""Per model type: the MLP module, whose output is added to the residual stream [batch, pos, d_model]."""

Values = list[torch.Tensor]
"""One tensor per layer."""
MIN_GROUP = 8
"""Prompts per (template, token length) group that `mean_values` requires."""


def attn_out(model: nn.Module, layer: int) -> nn.Module:
    return model.get_submodule(ATTN_OUT[model.config.model_type].format(layer))


def mlp(model: nn.Module, layer: int) -> nn.Module:
    return model.get_submodule(MLP[model.config.model_type].format(layer))


def d_head(model: nn.Module) -> int:
    config = model.config
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


@contextmanager
def hooked(pre: Sequence[tuple[nn.Module, Any]], post: Sequence[tuple[nn.Module, Any]]) -> Iterator[None]:
    """Forward pre-hooks and forward hooks for the block, removed in `finally`."""
    handles = [m.register_forward_pre_hook(fn) for m, fn in pre] + [m.register_forward_hook(fn) for m, fn in post]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def capture(model: nn.Module, ids: torch.Tensor) -> tuple[Values, Values]:
    """Every layer's attention-output input [batch, pos, head * d_head] and MLP output [batch, pos, d_model]."""
    n_layers = model.config.num_hidden_layers
    z: Values = [torch.empty(0)] * n_layers
    out: Values = [torch.empty(0)] * n_layers

    def save_z(layer: int) -> Any:
        return lambda _m, args: z.__setitem__(layer, args[0].detach().clone())

    def save_mlp(layer: int) -> Any:
        return lambda _m, _args, output: out.__setitem__(layer, output.detach().clone())

    layers = range(n_layers)
    with hooked([(attn_out(model, i), save_z(i)) for i in layers], [(mlp(model, i), save_mlp(i)) for i in layers]):
        model(input_ids=ids)
    return z, out


def mean_values(
    model: nn.Module, counterfactual: Sequence[torch.Tensor], templates: Sequence[str | None], end_only: bool = False
) -> tuple[list[tuple[Values, Values]], slice]:
    """The mean-ablation rule, in one place: for each prompt (its counterfactual ids [1, pos], unpadded), the
    values (head inputs, MLP outputs; per layer [1, pos or 1, width]) to put in place, and where.

    per position  at every position, the mean over the counterfactual prompts of the prompt's group: the
                  prompts of the same template and the same token length;
    END only      at END, the mean END value over all the prompts (word problems: counterfactual = reference).
    """
    if end_only:
        runs = [capture(model, ids) for ids in counterfactual]  # per prompt (z, mlp), per layer [1, pos, width]

        def end_mean(part: int) -> Values:  # per layer [1, 1, width]
            return [torch.cat([run[part][layer][:, -1] for run in runs]).mean(0)[None, None] for layer in layers]

        layers = range(model.config.num_hidden_layers)
        return [(end_mean(0), end_mean(1))] * len(counterfactual), slice(-1, None)
    groups: dict[tuple[str | None, int], list[int]] = {}
    for i, (ids, template) in enumerate(zip(counterfactual, templates, strict=True)):
        groups.setdefault((template, ids.shape[1]), []).append(i)
    assert min(map(len, groups.values())) >= MIN_GROUP, "a small group, for which the rule may differ"
    values: list[Any] = [None] * len(counterfactual)
    for rows in groups.values():
        z, mlp = capture(model, torch.cat([counterfactual[i] for i in rows]))  # per layer [group, pos, width]
        means = ([t.mean(0, keepdim=True) for t in z], [t.mean(0, keepdim=True) for t in mlp])  # [1, pos, width]
        for i in rows:
            values[i] = means
    return values, slice(None)


@torch.no_grad()
def knocked_logits(
    model: nn.Module,
    ids: torch.Tensor,
    heads: Sequence[tuple[int, int]],
    mlps: Sequence[int],
    z: Values,
    mlp_out: Values,
    where: slice = slice(None),
) -> torch.Tensor:
    """Logits [batch, pos, d_vocab] of unpadded `ids` [batch, pos] with `heads` ((layer, head) pairs) and `mlps`
    (layers) knocked out: at positions `where`, a head's slice takes z[layer]'s, an MLP's output mlp_out[layer]
    (each broadcast to [batch, positions, width])."""
    dh = d_head(model)

    def set_heads(layer: int) -> Any:
        def fn(_m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            x = args[0].clone()  # [batch, pos, head * d_head]
            for hl, h in heads:
                if hl == layer:
                    cols = slice(h * dh, (h + 1) * dh)
                    x[:, where, cols] = z[layer][:, where, cols]
            return (x, *args[1:])

        return fn

    def set_mlp(layer: int) -> Any:
        def fn(_m: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
            new = output.clone()  # [batch, pos, d_model]
            new[:, where] = mlp_out[layer][:, where]
            return new

        return fn

    pre = [(attn_out(model, layer), set_heads(layer)) for layer in sorted({hl for hl, _ in heads})]
    post = [(mlp(model, layer), set_mlp(layer)) for layer in sorted(set(mlps))]
    with hooked(pre, post):
        return model(input_ids=ids).logits
