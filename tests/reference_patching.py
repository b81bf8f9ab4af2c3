"""The plain reference for path patching: one full forward pass per component, with hooks.

Written to be obviously right rather than fast, and independent of the fast engine: it reads logits the way the
model's own CausalLM head does (`end_logits`) and freezes heads by replacing the whole o_proj input at every
position. Tests check the fast implementation against it; benchmarks time it, and their other loop baselines
(knockout, mediation) read logits through `end_logits` too, so that both sides of a ratio unembed END rows only.
"""

from __future__ import annotations

from typing import Any

import torch

from arithmech.models.hooks import hooks
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch


def end_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor | None, end: torch.Tensor) -> torch.Tensor:
    """`model(ids, mask).logits[rows, end]` [batch, d_vocab], unembedding each row's END position only.

    Prompts are right-padded, so END differs between rows and `logits_to_keep=1` (the last position) would read
    pads. Instead: the base model (its last_hidden_state is after the final norm), END rows gathered, then the
    CausalLM head's own steps on them: the output embedding and the final logit soft-cap where the config has
    one (Gemma 2). On a SmolLM2 pass the vocabulary projection of every position is about a fifth of the time.
    """
    device = model.get_input_embeddings().weight.device
    mask = None if mask is None else mask.to(device)
    hidden = model.base_model(input_ids=ids.to(device), attention_mask=mask, use_cache=False).last_hidden_state
    at_end = hidden[torch.arange(len(end), device=device), end.to(device)]  # [batch, d_model]
    logits = model.get_output_embeddings()(at_end)  # [batch, d_vocab]
    cap = getattr(model.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def _run(view: ModelView, batch: PatchingBatch, ids: torch.Tensor, mask: torch.Tensor) -> tuple[Any, ...]:
    """END logits [batch, d_vocab], o_proj inputs and MLP outputs [batch, pos, ...] of every layer."""
    z: list[Any] = [None] * view.dims.n_layers
    mlp: list[Any] = [None] * view.dims.n_layers

    def save_z(layer: int) -> Any:
        def fn(_m: Any, args: tuple[Any, ...]) -> None:
            z[layer] = args[0].detach().clone()

        return fn

    def save_mlp(layer: int) -> Any:
        def fn(_m: Any, _a: Any, out: Any) -> None:
            mlp[layer] = out.detach().clone()

        return fn

    layers = range(view.dims.n_layers)
    with hooks(
        pre=[(view.o_proj(layer), save_z(layer)) for layer in layers],
        post=[(view.mlp(layer), save_mlp(layer)) for layer in layers],
    ):
        logits = end_logits(view.model, ids, mask, batch.end)
    return logits, z, mlp


class ReferencePatcher:
    """Runs the reference and counterfactual prompts once, then one forward pass per sender."""

    @torch.no_grad()
    def __init__(self, view: ModelView, batch: PatchingBatch) -> None:
        self.view, self.batch = view, batch
        self.rows = torch.arange(len(batch))
        ref_logits, self.ref_z, self.ref_mlp = _run(view, batch, batch.ref_ids, batch.ref_mask)
        cf_logits, self.cf_z, self.cf_mlp = _run(view, batch, batch.cf_ids, batch.cf_mask)
        self.ref_logit = ref_logits[self.rows, batch.answer_ids]
        self.cf_logit = cf_logits[self.rows, batch.answer_ids]

    @torch.no_grad()
    def effect(self, sender: Component, variant: str) -> torch.Tensor:
        """Per-prompt relative change of the answer logit [batch] for one sender."""
        view, batch, rows = self.view, self.batch, self.rows
        d_head = view.dims.d_head
        pre, post = [], []
        for layer in range(view.dims.n_layers):

            def set_z(_m: Any, args: tuple[Any, ...], layer: int = layer) -> tuple[Any, ...]:
                z = args[0].clone() if variant == "total" else self.ref_z[layer].clone()
                if sender.layer == layer and sender.head is not None:
                    cols = slice(sender.head * d_head, (sender.head + 1) * d_head)
                    z[rows, batch.end, cols] = self.cf_z[layer][rows, batch.end, cols]
                return (z, *args[1:])

            def set_mlp(_m: Any, _a: Any, out: torch.Tensor, layer: int = layer) -> torch.Tensor:
                new = self.ref_mlp[layer].clone() if variant == "direct" else out.clone()
                if sender.layer == layer and sender.head is None:
                    new[rows, batch.end] = self.cf_mlp[layer][rows, batch.end]
                return new

            pre.append((view.o_proj(layer), set_z))
            post.append((view.mlp(layer), set_mlp))
        with hooks(pre=pre, post=post):
            new = end_logits(view.model, batch.ref_ids, batch.ref_mask, batch.end)[rows, batch.answer_ids]
        return ((new - self.ref_logit) / self.ref_logit.abs()).cpu()
