"""What every sender of the graph writes into the residual stream, at every position, from one forward pass.

The outputs of a run, kept compactly: the input embedding (the residual entering layer 0), each layer's o_proj
input z (a head's output is its z slice times its W_O block, computed when needed, so storing z costs one
d_model-sized tensor per layer instead of H), and each MLP's output. The o_proj bias is the same in every run,
so it is no sender's: it cancels in every difference between runs.

Edge circuits need a residual stream that is a plain sum of node outputs; Gemma 2/3 norm the attention and MLP
outputs as a whole before the add ("sandwich" norms), so a head has no additive output there and they are
refused (`check_edge_graph`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from arithmech.circuits.batch import at_end
from arithmech.errors import SpecError
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.view import ModelView


@dataclass
class SenderOutputs:
    """Sender outputs of one run (or their means): shapes [batch, pos, ...]; a mean has batch = pos = 1."""

    embed: torch.Tensor
    """[batch, pos, d_model]: the residual entering layer 0 (token, position and scale included)."""
    z: torch.Tensor
    """[layer, batch, pos, head * d_head]: o_proj input."""
    mlp_out: torch.Tensor
    """[layer, batch, pos, d_model]: MLP module output."""
    end_resid: torch.Tensor | None = None
    """[batch, d_model]: the residual entering the final norm at END (a plain run's; None for means)."""

    def head_outputs(self, view: ModelView, layer: int) -> torch.Tensor:
        """[head, batch, pos, d_model]: each head's output, z_h W_O[h]."""
        return view.head_outputs(layer, self.z[layer]).permute(2, 0, 1, 3)

    def positions_from(self, start: int) -> SenderOutputs:
        """The outputs at positions start.. (a mean, one position for all, stays)."""
        if self.embed.shape[1] == 1 or start == 0:
            return self
        return SenderOutputs(self.embed[:, start:], self.z[:, :, start:], self.mlp_out[:, :, start:], self.end_resid)

    def mean(self, mask: torch.Tensor) -> SenderOutputs:
        """Mean over prompts and real positions (mask [batch, pos]); MIB's mean ablation source."""
        weights = (mask / mask.sum()).to(self.embed.dtype).to(self.embed.device)[..., None]  # [batch, pos, 1]

        def avg(x: torch.Tensor) -> torch.Tensor:
            return (x * weights).sum(dim=(-3, -2), keepdim=True)

        return SenderOutputs(embed=avg(self.embed), z=avg(self.z), mlp_out=avg(self.mlp_out))


def check_edge_graph(view: ModelView) -> None:
    """A SpecError for architectures whose residual stream is not a sum of head and MLP outputs."""
    if view.spec.attn_out_norm or view.spec.mlp_out_norm:
        raise SpecError(
            f"edge circuits need a residual stream that is a sum of head and MLP outputs; {view.spec.name!r} norms "
            "the attention and MLP outputs as a whole before adding them, so a head has no output of its own "
            "there: choose a model of another family"
        )


@torch.no_grad()
def collect_sender_outputs(view: ModelView, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SenderOutputs:
    """Run the base model once and keep every sender's output at every position (and the residual at END)."""
    n = view.dims.n_layers
    embed: list[torch.Tensor] = []
    z: list[Any] = [None] * n
    mlp_out: list[Any] = [None] * n

    def keep_embed(_module: Any, args: tuple[Any, ...]) -> None:
        embed.append(args[0].detach())

    def keep_z(layer: int) -> Any:
        def fn(_module: Any, args: tuple[Any, ...]) -> None:
            z[layer] = args[0].detach()

        return fn

    def keep_mlp(layer: int) -> Any:
        def fn(_module: Any, _args: Any, output: Any) -> None:
            mlp_out[layer] = first_tensor(output).detach()

        return fn

    def keep_end(_module: Any, args: tuple[Any, ...]) -> None:
        end.append(at_end(args[0], attention_mask.long().sum(-1) - 1))

    end: list[torch.Tensor] = []
    pre = [(view.attn_norm(0), keep_embed), (view.final_norm, keep_end)]
    pre += [(view.o_proj(layer), keep_z(layer)) for layer in range(n)]
    post = [(view.mlp(layer), keep_mlp(layer)) for layer in range(n)]
    device = view.o_proj(0).weight.device
    with hooks(pre=pre, post=post):
        view.model.base_model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False)
    return SenderOutputs(embed=embed[0], z=torch.stack(z), mlp_out=torch.stack(mlp_out), end_resid=end[0])
