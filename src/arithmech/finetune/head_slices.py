"""Precise SFT's trainable per-head slices: small deltas on the selected heads' Q/K/V rows and O columns.

Background
    Zhang et al. (2024, section 4.3, Algorithm 2) improve arithmetic by fine-tuning only the key heads found by
    path patching: for a selected head h of layer l, the rows of W_Q, W_K, W_V that produce it and the columns of
    W_O that read it (W_O split into per-head blocks, Elhage et al. 2021), optionally plus whole MLP layers.
    Following Yu et al. (2023), the gradient of layer l's head slices is multiplied by H / h_l (H heads per layer,
    h_l of them selected). Everything else stays bit-identical.

H / h_l under AdamW: on the gradient or on the learning rate (`HEAD_SCALES`)
    Adam divides each entry's first moment by the root of its second, so a gradient multiplied by a constant c
    gives the update m / (sqrt(v) + eps / c) instead of m / (sqrt(v) + eps): the paper's scaling changes Adam's
    steps only through eps (and through gradient clipping, whose global norm it raises). Decoupled weight decay
    does not read the gradient. Under SGD the same scaling multiplies the step by c. The form that means
    "layer l's slices move H / h_l times faster" under Adam is a learning rate of lr * H / h_l for those slices:
        gradient        the paper's: gradients times H / h_l (default; nearly a no-op under AdamW)
        learning-rate   each layer's slices are their own optimizer groups with lr_scale = H / h_l (the schedule
                        scales every group alike; decoupled decay, lr * wd * W, follows the group's lr)
        none            no scaling

How, structurally (peft's "trainable tokens" idea, applied to heads)
    Every weight of the model is frozen. Each projection that a selected head touches gets one trainable delta
    holding only the selected rows (Q/K/V: output side) or columns (O: input side), in the weight's own layout,
    initialised at zero, so the wrapped model starts exactly where the base model is. A forward hook adds the
    delta's contribution; with Delta as an (in, out) matrix (Linear's transpose, GPT-2 Conv1D's own layout):

        output side (q/k/v):  y[..., R] += x @ Delta + delta_b     x [..., d_in], Delta [d_in, |R|]
        input side (o):       y         += z[..., C] @ Delta        z [..., head * d_head], Delta [|C|, d_model]

    Gradients and optimiser state thus exist only for the slices, so memory and step time fall with the number
    of heads (a mask on full matrices would keep full Adam state). `PreciseSlices.merge_` writes W0 + Delta into
    the selected entries when training ends; no other entry is ever written.

    - Grouped-query attention: the K/V rows of kv group g serve query heads g*G .. (g+1)*G - 1 (G = H / H_kv).
      They are trained when any head of the group is selected, once, and `kv_groups` reports which heads
      brought each group in (also logged).
    - Biases: the q/k/v bias entries of selected heads train with their rows (Qwen2, GPT-2, GPT-NeoX); an o_proj
      bias is shared by all heads and stays frozen.
    - H / h_l (gradient form): identity in the forward pass and a gradient multiplied by H / h_l in the backward
      pass (`scale_grad`), so the forward value is exact; K/V deltas and biases of layer l take the same factor.
    - Deltas are float32 whatever the model dtype (a "master" copy); the hooks cast them to the activation dtype.
    - Fused Q/K/V (GPT-2 c_attn, GPT-NeoX query_key_value, Phi-3 qkv_proj) get one delta with the union of the
      rows, found through `ModelView.head_weight_slices`, which knows each layout.
    - Decoupled weight decay must act on W0 + Delta, not on Delta alone: see finetune/optim.py.

Usage
    >>> slices = PreciseSlices(view, heads=[Component(14, 2), Component(18, 5)], mlp_layers=[19])
    >>> wrapped = PreciseModel(view.model, slices)      # forward = model with the deltas added
    >>> ...train the parameters that require grad...
    >>> slices.merge_()                                  # base weights now hold the trained slices

References: Zhang et al. 2024 sec. 4.3 and Algorithm 2; Yu et al. 2023 (gradient rescaling); METHODS.md sec. 7.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from arithmech.errors import ConfigError
from arithmech.finetune.settings import HEAD_SCALES
from arithmech.models.hooks import PostHook, hooks
from arithmech.models.sites import Component
from arithmech.models.view import ModelView

logger = logging.getLogger(__name__)

class _GradScale(torch.autograd.Function):
    """Identity forward, gradient times `scale` backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """`x` unchanged in value; its gradient is multiplied by `scale` (H / h_l for head slices)."""
    return x if scale == 1.0 else _GradScale.apply(x, scale)


@dataclass(frozen=True)
class DeltaEntry:
    """Entries of one parameter after training: `values` replace `parameter` along `dim` at `index` (or all)."""

    parameter: str
    """Dotted name in the base model, e.g. "model.layers.3.self_attn.q_proj.weight"."""
    dim: int | None
    index: tuple[int, ...] | None
    """Positions along `dim`; None with dim None = the whole parameter."""
    values: torch.Tensor


class SliceDelta(nn.Module):
    """Trainable delta for some rows (output side) or columns (input side) of one projection's weight."""

    def __init__(
        self, target: nn.Module, index: Sequence[int], dim: int, conv1d: bool, train_bias: bool, grad_scale: float
    ) -> None:
        super().__init__()
        weight = target.weight
        object.__setattr__(self, "target", target)  # a plain reference: its parameters stay the model's own
        self.dim = dim
        self.conv1d = conv1d
        self.output_side = dim == (1 if conv1d else 0)
        self.grad_scale = grad_scale
        self.register_buffer("index", torch.tensor(sorted(index), device=weight.device), persistent=False)
        shape = list(weight.shape)
        shape[dim] = len(index)
        self.weight = nn.Parameter(torch.zeros(shape, dtype=torch.float32, device=weight.device))
        bias = getattr(target, "bias", None)
        has_bias = train_bias and self.output_side and isinstance(bias, torch.Tensor)
        zeros = torch.zeros(len(index), dtype=torch.float32, device=weight.device)
        self.bias = nn.Parameter(zeros) if has_bias else None

    def hook(self, _module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        """Forward hook on the target: add the delta's contribution to its output."""
        x = args[0]
        w = scale_grad(self.weight, self.grad_scale).to(x.dtype)
        w_io = w if self.conv1d else w.T  # [in or |C|, |R| or out]
        if not self.output_side:
            return output + x.index_select(-1, self.index) @ w_io  # [..., d_model]
        extra = x @ w_io  # [..., |R|]
        if self.bias is not None:
            extra = extra + scale_grad(self.bias, self.grad_scale).to(x.dtype)
        return output.index_add(-1, self.index, extra)

    def weight_anchor(self) -> torch.Tensor:
        """The frozen base entries W0 the delta adds to (float32, the delta's shape)."""
        return self.target.weight.detach().index_select(self.dim, self.index).float()

    def bias_anchor(self) -> torch.Tensor:
        return self.target.bias.detach().index_select(0, self.index).float()

    @torch.no_grad()
    def merge_(self) -> None:
        """Write W0 + Delta into the selected entries of the target and zero the delta."""
        w = self.target.weight
        w.index_copy_(self.dim, self.index, (self.weight_anchor() + self.weight).to(w.dtype))
        self.weight.zero_()
        if self.bias is not None:
            b = self.target.bias
            b.index_copy_(0, self.index, (self.bias_anchor() + self.bias).to(b.dtype))
            self.bias.zero_()


@dataclass
class _Touched:
    """What the selection needs from one projection module."""

    module: nn.Module
    dim: int
    roles: set[str] = field(default_factory=set)
    rows: set[int] = field(default_factory=set)


def _touched_modules(view: ModelView, layer: int, heads: list[int]) -> list[_Touched]:
    """The projections of `layer` that the selected heads touch, each with the union of their rows/columns.

    K/V slices come from `head_weight_slices`, which maps a query head to its kv group, so a group shared by two
    selected heads appears once.
    """
    touched: dict[int, _Touched] = {}
    for head in heads:
        for role, ws in view.head_weight_slices(layer, head).items():
            entry = touched.setdefault(id(ws.module), _Touched(ws.module, ws.dim))
            entry.roles.add(role)
            entry.rows.update(range(ws.index.start, ws.index.stop))
    return list(touched.values())


class PreciseSlices(nn.Module):
    """The trainable deltas of a head selection, plus whole MLP layers trained in place.

    Construction freezes every parameter of `view.model` and then makes the selected MLPs trainable.
    """

    def __init__(
        self,
        view: ModelView,
        heads: Sequence[Component],
        mlp_layers: Sequence[int] = (),
        head_scale: str = "gradient",
    ) -> None:
        super().__init__()
        if head_scale not in HEAD_SCALES:
            raise ConfigError(f"head_scale {head_scale!r} is not one of {', '.join(HEAD_SCALES)}")
        self.head_scale = head_scale
        dims = view.dims
        self.heads = sorted({c for c in heads if c.head is not None})
        self.mlp_layers = sorted(set(mlp_layers))
        for param in view.model.parameters():
            param.requires_grad_(False)
        names = {id(m): name for name, m in view.model.named_modules()}
        by_layer: dict[int, list[int]] = {}
        for c in self.heads:
            assert c.head is not None
            by_layer.setdefault(c.layer, []).append(c.head)
        self.kv_groups: dict[int, dict[int, list[int]]] = {}
        self.layer_scale: dict[int, float] = {}
        """H / h_l of each layer with selected heads, whatever `head_scale` does with it."""
        self.delta_layer: dict[str, int] = {}
        deltas: dict[str, SliceDelta] = {}
        self.target_names: dict[str, str] = {}
        self.roles: dict[str, list[str]] = {}
        for layer, selected in sorted(by_layer.items()):
            self.layer_scale[layer] = dims.n_heads / len(selected)
            scale = self.layer_scale[layer] if head_scale == "gradient" else 1.0
            groups: dict[int, list[int]] = {}
            for head in selected:
                groups.setdefault(head // dims.group_size, []).append(head)
            self.kv_groups[layer] = groups
            if dims.group_size > 1:
                for group, members in sorted(groups.items()):
                    logger.info(
                        "grouped-query attention: layer %d trains the K/V rows of kv group %d (shared by query "
                        "heads %d-%d) because head(s) %s are selected",
                        layer, group, group * dims.group_size, (group + 1) * dims.group_size - 1, members,
                    )  # fmt: skip
            for entry in _touched_modules(view, layer, selected):
                name = names[id(entry.module)]
                key = name.replace(".", "__")  # ModuleDict keys cannot hold dots
                deltas[key] = SliceDelta(
                    entry.module, sorted(entry.rows), entry.dim, view.spec.conv1d, train_bias=True, grad_scale=scale
                )
                self.target_names[key] = name
                self.roles[key] = sorted(entry.roles)
                self.delta_layer[key] = layer
        self.deltas = nn.ModuleDict(deltas)
        self.mlp_names = [names[id(view.mlp(layer))] for layer in self.mlp_layers]
        for layer in self.mlp_layers:
            for param in view.mlp(layer).parameters():
                param.requires_grad_(True)
        object.__setattr__(self, "model", view.model)

    def post_hooks(self) -> list[tuple[nn.Module, PostHook]]:
        """(target module, hook) pairs for `models.hooks.hooks(post=...)`."""
        return [(delta.target, delta.hook) for delta in self.deltas.values()]  # type: ignore[union-attr]

    def mlp_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name in the model, parameter) of the MLP layers trained whole."""
        out = []
        for name in self.mlp_names:
            out += [(f"{name}.{p}", param) for p, param in self.model.get_submodule(name).named_parameters()]
        return out

    def lr_scale(self, layer: int) -> float:
        """Learning-rate multiplier of `layer`'s slices: H / h_l in the learning-rate form, else 1."""
        return self.layer_scale[layer] if self.head_scale == "learning-rate" else 1.0

    def trainable_parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters()) + sum(p.numel() for _, p in self.mlp_parameters())

    def merge_(self) -> None:
        """Write every trained slice into the base weights (the MLPs were trained in place)."""
        for delta in self.deltas.values():
            delta.merge_()  # type: ignore[operator]

    def delta_entries(self) -> list[DeltaEntry]:
        """What changed, after `merge_`: the selected rows/columns of each projection and the whole MLPs."""
        entries = []
        for key, delta in self.deltas.items():
            assert isinstance(delta, SliceDelta)
            name, index = self.target_names[key], tuple(delta.index.tolist())
            w = delta.target.weight.detach()
            entries.append(DeltaEntry(f"{name}.weight", delta.dim, index, w.index_select(delta.dim, delta.index)))
            if delta.bias is not None:
                b = delta.target.bias.detach()
                entries.append(DeltaEntry(f"{name}.bias", 0, index, b.index_select(0, delta.index)))
        entries += [DeltaEntry(name, None, None, p.detach()) for name, p in self.mlp_parameters()]
        return entries

    def summary(self) -> dict[str, Any]:
        """The selection as written to metadata: heads, MLPs, H / h_l and its form, K/V groups, touched modules."""
        return {
            "heads": [c.name for c in self.heads],
            "mlps": [f"mlp.{layer}" for layer in self.mlp_layers],
            "head_scale": self.head_scale,
            "layer_scale": {str(layer): s for layer, s in self.layer_scale.items()},
            "kv_groups_trained": {
                str(layer): {str(g): heads for g, heads in groups.items()} for layer, groups in self.kv_groups.items()
            },
            "modules": {self.target_names[k]: self.roles[k] for k in self.deltas},
            "trainable_parameters": self.trainable_parameter_count(),
        }


class PreciseModel(nn.Module):
    """The frozen model with the selected slices' deltas added by scoped forward hooks.

    The wrapper owns both, so data parallelism (DDP) sees the deltas and the MLPs as its trainable parameters.
    """

    def __init__(self, model: nn.Module, slices: PreciseSlices) -> None:
        super().__init__()
        self.model = model
        self.slices = slices
        # FSDP's transformer auto-wrap reads the layer classes from here: each decoder layer its own unit
        self._no_split_modules = getattr(model, "_no_split_modules", None)

    def forward(self, **kwargs: Any) -> Any:
        with hooks(post=self.slices.post_hooks()):
            return self.model(**kwargs)
