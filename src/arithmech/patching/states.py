"""END states: everything path patching needs from one forward pass, taken at each prompt's last token.

One forward pass with hooks records, per layer and at END only (so memory does not grow with prompt
length): the residual entering the block, the per-head o_proj input z, the attention output, the residual
the MLP reads and the MLP output; and the residual entering the final norm. With right padding, END is each
prompt's own last token, and causal attention makes every prompt's result that of its unpadded run.

Two savings for the runs that follow: `keep_cache` keeps the pass's keys/values of every position (the
reference run's, for decoding steps at END and for the counterfactual run); `past` runs only the positions
after a cached start that the prompts share with that run (the few-shot examples before the query), whose
activations are the cached run's own by causality.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.shared_prefix import full_cache
from arithmech.models.view import ModelView, cache_kwarg


@dataclass
class EndStates:
    """Activations at END. Shapes use [layer, batch, ...]; all tensors are on the model's first device."""

    resid_pre: torch.Tensor
    """[layer + 1, batch, d_model]: residual entering each block; the last entry enters the final norm."""
    z: torch.Tensor
    """[layer, batch, head * d_head]: o_proj input (heads concatenated)."""
    attn_out: torch.Tensor
    """[layer, batch, d_model]: o_proj output (before any post-attention norm)."""
    mlp_read: torch.Tensor
    """[layer, batch, d_model]: residual the MLP reads (input of its pre-norm)."""
    mlp_out: torch.Tensor
    """[layer, batch, d_model]: MLP module output (before any post-MLP norm)."""
    cache: Any = None
    """With `keep_cache`: the run's keys/values of every position of every layer (a `full_cache`)."""

    @property
    def resid_final(self) -> torch.Tensor:
        return self.resid_pre[-1]


def _at_end(x: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """[batch, pos, d] -> [batch, d] at each row's END."""
    return x[torch.arange(x.shape[0], device=x.device), end.to(x.device)]


@torch.no_grad()
def collect_end_states(
    view: ModelView,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    end: torch.Tensor,
    keep_cache: bool = False,
    past: Any = None,
) -> EndStates:
    """Run the base model once on a right-padded batch and record the END states of every layer.

    past: a cache of the first `past.get_seq_length()` positions of these very prompts (`SharedPrefix.past`); then
    only the later positions run (every END must be among them). input_ids and attention_mask are whole.
    """
    n = view.dims.n_layers
    start = 0 if past is None else past.get_seq_length()
    end = end - start
    slots: dict[str, list[torch.Tensor | None]] = {
        key: [None] * n for key in ("resid_pre", "z", "attn_out", "mlp_read", "mlp_out")
    }
    final: list[torch.Tensor] = []
    device = view.final_norm.weight.device

    def save_input(key: str, layer: int) -> Any:
        def fn(_module: Any, args: tuple[Any, ...]) -> None:
            slots[key][layer] = _at_end(args[0], end).detach().to(device)

        return fn

    def save_output(key: str, layer: int) -> Any:
        def fn(_module: Any, _args: Any, output: Any) -> None:
            slots[key][layer] = _at_end(first_tensor(output), end).detach().to(device)

        return fn

    def save_final(_module: Any, args: tuple[Any, ...]) -> None:
        final.append(_at_end(args[0], end).detach().to(device))

    pre = [(view.final_norm, save_final)]
    post = []
    for layer in range(n):
        pre += [
            (view.attn_norm(layer), save_input("resid_pre", layer)),
            (view.o_proj(layer), save_input("z", layer)),
            (view.mlp_norm(layer), save_input("mlp_read", layer)),
        ]
        post += [
            (view.o_proj(layer), save_output("attn_out", layer)),
            (view.mlp(layer), save_output("mlp_out", layer)),
        ]
    first_device = view.blocks[0].get_submodule(view.spec.o_proj).weight.device
    cache = past if past is not None else full_cache() if keep_cache else None
    cached = {cache_kwarg(view.model.base_model): cache} if cache is not None else {}
    with hooks(pre=pre, post=post):
        view.model.base_model(
            input_ids=input_ids[:, start:].to(first_device),
            attention_mask=attention_mask.to(first_device),
            use_cache=cache is not None,
            **cached,
        )
    stacked: dict[str, Any] = {key: torch.stack(values) for key, values in slots.items()}  # type: ignore[arg-type]
    stacked["resid_pre"] = torch.cat([stacked["resid_pre"], final[0][None]])
    return EndStates(**stacked, cache=cache if keep_cache else None)
