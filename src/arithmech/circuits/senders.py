"""What every sender of the graph writes into the residual stream, at every position, from one forward pass.

The outputs of a run, kept compactly: the input embedding (the residual entering layer 0), each layer's o_proj
input z (a head's output is its z slice times its W_O block, computed when needed, so storing z costs one
d_model-sized tensor per layer instead of H), and each MLP's output. The o_proj bias is the same in every run,
so it is no sender's: it cancels in every difference between runs.

Norms after the attention and the MLP (Gemma 2/3's "sandwich" norms)
    The residual stream must be a plain sum of node outputs. An MLP's output is then its normed output (the
    norm is part of the node). The attention output is normed as a whole, o = gain * a / rms(a) with
    a = sum_h z_h W_O[h] at each position, so a head's output is its share of it:
        out_h = gain * (r z_h) W_O[h],   r = 1 / rms(a) of the same run and position
    The shares sum exactly to what the layer adds, and they are linear in the scaled input r z, which is what is
    kept here as `z` (`scaled_z`): differences and means of head outputs stay those of z, as without the norm.
    A head's share depends on its layer's other heads through r; that is the norm's own coupling.
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
    """[layer, batch, pos, head * d_head]: o_proj input (`scaled_z` under a post-attention norm)."""
    mlp_out: torch.Tensor
    """[layer, batch, pos, d_model]: what the MLP adds to the residual (`mlp_sender`'s output)."""
    end_resid: torch.Tensor | None = None
    """[batch, d_model]: the residual entering the final norm at END (a plain run's; None for means)."""

    def head_outputs(self, view: ModelView, layer: int) -> torch.Tensor:
        """[head, batch, pos, d_model]: each head's output, z_h W_O[h] (times the norm's gain, see above)."""
        return head_outputs(view, layer, self.z[layer]).permute(2, 0, 1, 3)

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
    """A SpecError for architectures whose head outputs cannot be written as a sum of shares (see above)."""
    norm = view.attn_out_norm(0)
    if norm is None:
        return
    if getattr(view.o_proj(0), "bias", None) is not None or getattr(norm, "bias", None) is not None:
        raise SpecError(
            f"edge circuits split a post-attention norm into head shares only without biases; {view.spec.name!r} "
            "has an o_proj or norm bias: choose a model of another family"
        )
    if _norm_eps(norm) is None:
        raise SpecError(
            f"edge circuits need the post-attention norm of {view.spec.name!r} to be an RMS norm with an `eps`; "
            f"found {type(norm).__name__}: choose a model of another family"
        )


def _norm_eps(norm: torch.nn.Module) -> float | None:
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    return float(eps) if isinstance(eps, (int, float)) else None


def scaled_z(view: ModelView, layer: int, z: torch.Tensor) -> torch.Tensor:
    """The o_proj input z [..., head * d_head] as senders carry it: z, or r z under a post-attention norm."""
    norm = view.attn_out_norm(layer)
    if norm is None:
        return z
    a = view.o_proj(layer).forward(z).float()  # forward: not through the hooks on o_proj
    r = torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + _norm_eps(norm))  # type: ignore[operator]
    return (z.float() * r).to(z.dtype)


def head_outputs(view: ModelView, layer: int, z: torch.Tensor) -> torch.Tensor:
    """[..., head, d_model]: each head's output from the scaled o_proj input z (`scaled_z`)."""
    out = view.head_outputs(layer, z)
    norm = view.attn_out_norm(layer)
    if norm is None:
        return out
    ones = torch.ones(out.shape[-1], dtype=torch.float32, device=out.device)
    gain = norm.forward(ones) * (1.0 + _norm_eps(norm)) ** 0.5  # type: ignore[operator]  # rms(ones) = 1
    return out * gain.to(out.dtype)


def mlp_sender(view: ModelView, layer: int) -> torch.nn.Module:
    """The module whose output is what the MLP adds to the residual: its output norm, if any, else the MLP."""
    norm = view.mlp_out_norm(layer)
    return norm if norm is not None else view.mlp(layer)


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
            z[layer] = scaled_z(view, layer, args[0].detach())

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
    post = [(mlp_sender(view, layer), keep_mlp(layer)) for layer in range(n)]
    device = view.o_proj(0).weight.device
    with hooks(pre=pre, post=post):
        view.model.base_model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False)
    return SenderOutputs(embed=embed[0], z=torch.stack(z), mlp_out=torch.stack(mlp_out), end_resid=end[0])
