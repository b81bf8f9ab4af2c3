"""LoRA analysis: what a low-rank adapter changes in the FFN neurons that predict the answer.

Background
    Yu & Ananiadou (2024) fine-tune a model with LoRA on arithmetic and find that the adapter raises the
    probability of the correct answer by amplifying the activation coefficients of the FFN neurons related to
    the prediction (the top CNA / log-increase neurons). This module trains a small LoRA adapter on chosen
    modules of chosen layers (or loads a user's peft adapter) and compares the END coefficients of given
    neurons with and without it. (METHODS.md sec. 6.)

Formula
    A LoRA adapter replaces a projection W [out, in] by  W + (alpha / r) * B A  with A [r, in], B [out, r].
    Training (`train_layer_lora`) minimises the cross-entropy of the answer token at END only,

        loss = mean over prompts of  -log softmax(logits at END)[answer]

    with AdamW on A and B alone (every base parameter frozen). A ~ U(-1/sqrt(in), 1/sqrt(in)) (peft's default
    kaiming bound) drawn from a local generator seeded with `seed`, B = 0, so the fresh adapter is an exact
    no-op; minibatch order comes from the same generator, so a seed fixes the whole run (on one device).
    For neurons (l, k), `coefficient_change` reports the END coefficient m_lk per prompt

        before [row, neuron]   base model
        after  [row, neuron]   base model + adapter

    and their means; with answer ids it also reports each neuron's log-probability increase LI (sec. 6) with
    and without the adapter, each read with its own run's END scales, and, when the adapter changes a down
    projection, with the adapted value vectors W_down + (alpha / r) B A (merged for that pass only).
    Training runs in the model's current mode (eval after `load_model`: no dropout).

Which modules
    `LoraTrainConfig.modules` names modules per block through the model's ArchSpec, not llama names: "mlp"
    = every linear projection inside the MLP (gate/up/down, c_fc/c_proj, dense_h_to_4h/dense_4h_to_h,
    fused gate_up_proj), "attn" = every linear projection inside the attention module (q/k/v/o, fused
    qkv_proj / c_attn), or a dotted path inside the block ("mlp.down_proj"). GPT-2's Conv1D is handled by
    peft's fan_in_fan_out.

The base model is left as it was
    peft injects an adapter into the model in place. `applied_lora` injects it for the duration of a block
    and, in `finally`, unloads it (the original modules go back in place, unmerged) and restores every
    parameter's requires_grad, the train/eval mode and the config attributes peft touches; the caller's
    global RNG is not consumed. A `LoraAdapter` is detached: its peft config plus its weights on the CPU.

Usage
    >>> cfg = LoraTrainConfig(layers=(20,), modules=("mlp",), rank=4, steps=40)
    >>> adapter = train_layer_lora(handle, ids, mask, end, answers, cfg)
    >>> adapter.save("runs/lora-l20")                           # a peft adapter folder
    >>> change = coefficient_change(handle, "runs/lora-l20", ids, mask, end, [(20, 5769), (21, 12)], answers)
    >>> change.rows()                                            # mean m and LI per neuron, before and after

References: Yu & Ananiadou, EMNLP 2024 (arXiv 2409.14144), LoRA analysis; Hu et al., "LoRA", ICLR 2022;
METHODS.md sec. 6.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from arithmech.errors import ConfigError
from arithmech.models.load import ModelHandle
from arithmech.models.view import ModelView
from arithmech.neurons.coefficients import end_coefficients
from arithmech.runs import atomic_open, atomic_write_text

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraTrainConfig:
    """Where to put a LoRA adapter and how to train it."""

    layers: tuple[int, ...] = field(metadata={"help": "decoder layers that get the adapter"})
    modules: tuple[str, ...] = field(
        default=("mlp",), metadata={"help": "mlp, attn, or dotted paths inside a block (mlp.down_proj)"}
    )
    rank: int = field(default=8, metadata={"help": "LoRA rank r"})
    alpha: float = field(default=16.0, metadata={"help": "LoRA alpha; the update is scaled by alpha / rank"})
    steps: int = field(default=40, metadata={"help": "optimizer steps"})
    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate"})
    batch_size: int = field(default=16, metadata={"help": "prompts per step"})
    seed: int = field(default=0, metadata={"help": "seed of the A initialisation and the minibatch order"})

    def __post_init__(self) -> None:
        for name in ("layers", "modules"):
            value = getattr(self, name)
            if isinstance(value, (list, int, str)):
                object.__setattr__(self, name, tuple(value) if isinstance(value, list) else (value,))
        if not self.layers:
            raise ConfigError("layers is empty; name at least one layer to put the LoRA adapter on")
        if not self.modules:
            raise ConfigError("modules is empty; use mlp, attn or a dotted module path inside a block")
        for name in ("rank", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.steps < 0:
            raise ConfigError(f"steps must be 0 or more (got {self.steps})")
        if not self.lr > 0:
            raise ConfigError(f"lr must be positive (got {self.lr})")


@dataclass
class LoraAdapter:
    """A LoRA adapter detached from any model: its peft LoraConfig and weights (CPU tensors)."""

    config: Any
    """peft.LoraConfig; target_modules are full module names of the model it was made for."""
    state: dict[str, torch.Tensor]
    """peft's adapter state dict (keys as in adapter_model.safetensors)."""
    losses: tuple[float, ...] = ()
    """Training loss per step (empty for a loaded adapter)."""

    def save(self, path: str | Path) -> None:
        """Write a peft adapter folder (PeftModel.from_pretrained reads it), each file atomically."""
        from safetensors.torch import save as save_safetensors

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        with atomic_open(out / ADAPTER_WEIGHTS, "wb") as handle:
            handle.write(save_safetensors({k: v.contiguous() for k, v in self.state.items()}, {"format": "pt"}))
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in self.config.to_dict().items()}
        atomic_write_text(out / ADAPTER_CONFIG, json.dumps(config, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class CoefficientChange:
    """END coefficients (and log-probability increases) of chosen neurons without vs with an adapter."""

    neurons: tuple[tuple[int, int], ...]
    """(layer, neuron) pairs, in the column order of the tensors."""
    before: torch.Tensor  # [row, neuron]
    after: torch.Tensor  # [row, neuron]
    li_before: torch.Tensor | None = None  # [row, neuron]
    li_after: torch.Tensor | None = None  # [row, neuron]

    def rows(self) -> list[dict[str, Any]]:
        """One row per neuron: mean coefficient (and LI) before and after, their difference and ratio."""
        out = []
        mean_b, mean_a = self.before.mean(0), self.after.mean(0)
        for j, (layer, neuron) in enumerate(self.neurons):
            b, a = float(mean_b[j]), float(mean_a[j])
            row: dict[str, Any] = {
                "neuron": f"{layer}_{neuron}",
                "layer": layer,
                "index": neuron,
                "coef_before": b,
                "coef_after": a,
                "coef_change": a - b,
                "coef_ratio": a / b if b != 0 else math.nan,
            }
            if self.li_before is not None and self.li_after is not None:
                li_b, li_a = float(self.li_before[:, j].mean()), float(self.li_after[:, j].mean())
                row.update(li_before=li_b, li_after=li_a, li_change=li_a - li_b)
            out.append(row)
        return out


# -- which modules --------------------------------------------------------------------------------------------
def target_module_names(view: ModelView, layers: Sequence[int], modules: Sequence[str]) -> list[str]:
    """Full names (from the model root) of the linear projections that `modules` selects in `layers`."""
    from transformers.pytorch_utils import Conv1D

    n = view.dims.n_layers
    bad = [layer for layer in layers if not 0 <= int(layer) < n]
    if bad:
        raise ConfigError(f"layers {bad} do not exist: the model has layers 0..{n - 1}")
    names_of = {id(m): name for name, m in view.model.named_modules()}
    found: list[str] = []
    for layer in layers:
        for entry in modules:
            path = {"mlp": view.spec.mlp, "attn": view.spec.attn}.get(entry, entry)
            try:
                root = view.module(int(layer), path)
            except AttributeError:
                raise ConfigError(
                    f"module {entry!r} is not in block {layer} of this {view.spec.name} model; use mlp, attn or "
                    "a dotted path inside a block"
                ) from None
            leaves = [m for m in root.modules() if isinstance(m, (nn.Linear, Conv1D))]
            if not leaves:
                raise ConfigError(f"module {entry!r} of block {layer} holds no linear projection to adapt")
            found += [names_of[id(m)] for m in leaves if names_of[id(m)] not in found]
    return found


# -- inject and remove ----------------------------------------------------------------------------------------
@contextmanager
def applied_lora(handle: ModelHandle, adapter: LoraAdapter | str | Path) -> Iterator[Any]:
    """The handle's model runs with `adapter` inside the block; it is exactly the base model again after.

    `adapter` is a LoraAdapter or a peft adapter folder (read with PeftModel.from_pretrained). Yields the
    PeftModel; `handle.view` sees the adapted modules while the block runs.
    """
    from peft import PeftModel, get_peft_model, set_peft_model_state_dict

    def build(model: nn.Module) -> Any:
        if not isinstance(adapter, LoraAdapter):
            return _from_folder(PeftModel, model, Path(adapter))
        try:
            peft_model = get_peft_model(model, copy.deepcopy(adapter.config))
        except ValueError as err:
            raise ConfigError(
                f"the adapter does not fit this model ({str(err).splitlines()[0][:200]}); "
                "use an adapter made for the same base model"
            ) from None
        result = set_peft_model_state_dict(peft_model, adapter.state)
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing or result.unexpected_keys:
            peft_model.unload()
            raise ConfigError(
                f"the adapter's weights do not fit its config (missing {missing[:2]}, unexpected "
                f"{list(result.unexpected_keys)[:2]}); save and load the adapter as one piece"
            )
        return peft_model

    with _injected(handle, build) as peft_model:
        yield peft_model


@contextmanager
def _injected(handle: ModelHandle, build: Any) -> Iterator[Any]:
    """Run `build(model) -> PeftModel` and yield it; in `finally`, unload it and restore what peft changed."""
    model = handle.model
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    training = model.training
    config_attrs = dict(vars(model.config))
    peft_model: Any = None
    try:
        with _quiet_rng(handle):
            peft_model = build(model)
        model.train(training)
        yield peft_model
    finally:
        if peft_model is not None:
            peft_model.unload()  # puts the original modules back, unmerged
        for name, p in model.named_parameters():
            p.requires_grad_(grads.get(name, p.requires_grad))
        model.train(training)
        for key in set(vars(model.config)) - set(config_attrs):
            delattr(model.config, key)
        for key, value in config_attrs.items():
            if getattr(model.config, key, None) is not value:
                setattr(model.config, key, value)


def _from_folder(peft_model_cls: Any, model: nn.Module, folder: Path) -> Any:
    if not (folder / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"{str(folder)!r} is not a peft adapter folder (no {ADAPTER_CONFIG}); check the path")
    try:
        return peft_model_cls.from_pretrained(model, str(folder), is_trainable=False)
    except (RuntimeError, ValueError, KeyError) as err:
        raise ConfigError(
            f"the adapter in {str(folder)!r} does not fit this model ({str(err).splitlines()[0][:200]}); "
            "use an adapter trained on the same base model"
        ) from None


@contextmanager
def _quiet_rng(handle: ModelHandle) -> Iterator[None]:
    """peft initialises adapters with the global RNG; fork it so the caller's stream is not consumed, and
    silence the transformers deprecation warning that peft's own attribute probe triggers."""
    devices = list(range(torch.cuda.device_count())) if handle.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


# -- training -------------------------------------------------------------------------------------------------
def answer_loss(
    view: ModelView, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor, answer_ids: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of the answer token at END (a scalar that carries gradients)."""
    width = int(end.max()) + 1
    logits = view.end_logits(ids[:, :width], mask[:, :width], end)  # [row, d_vocab] float32
    return torch.nn.functional.cross_entropy(logits, answer_ids.to(logits.device))


def train_layer_lora(
    handle: ModelHandle,
    ids: torch.Tensor,
    mask: torch.Tensor,
    end: torch.Tensor,
    answer_ids: torch.Tensor,
    cfg: LoraTrainConfig,
) -> LoraAdapter:
    """Train a LoRA adapter on `cfg.modules` of `cfg.layers` to predict each prompt's answer token at END.

    ids/mask: right-padded prompts [row, pos]; end: [row] last real token; answer_ids: [row]. The model is
    left unchanged; the adapter comes back detached (apply it with `applied_lora`).
    """
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    if len(end) == 0:
        raise ConfigError("there are no training prompts; give at least one tokenized prompt")
    view = handle.view
    targets = target_module_names(view, cfg.layers, cfg.modules)
    config = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=0.0,
        target_modules=targets,
        fan_in_fan_out=view.spec.conv1d,
        bias="none",
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    losses: list[float] = []
    with _injected(handle, lambda model: get_peft_model(model, config)) as peft_model:
        params = _init_lora_a(peft_model, generator)
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        for rows in _minibatches(len(end), cfg.batch_size, cfg.steps, generator):
            loss = answer_loss(view, ids[rows], mask[rows], end[rows], answer_ids[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        state = {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(peft_model).items()}
        config = copy.deepcopy(peft_model.peft_config["default"])
    if losses:
        logger.info("LoRA on %d modules: loss %.4f -> %.4f in %d steps", len(targets), losses[0], losses[-1], cfg.steps)
    return LoraAdapter(config, state, tuple(losses))


def _init_lora_a(peft_model: Any, generator: torch.Generator) -> list[nn.Parameter]:
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) from `generator`, B = 0; returns the trainable LoRA parameters."""
    params = []
    for name, p in peft_model.named_parameters():
        if "lora_" not in name:
            continue
        with torch.no_grad():
            if ".lora_A." in name:
                bound = 1.0 / math.sqrt(p.shape[1])
                draw = torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1  # [r, in]
                p.copy_((draw * bound).to(p.dtype))
            else:
                p.zero_()
        p.requires_grad_(True)
        params.append(p)
    return params


def _minibatches(n: int, size: int, steps: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """`steps` minibatches of row indices: shuffled epochs from `generator`, or all rows if n <= size."""
    order = torch.empty(0, dtype=torch.long)
    for _ in range(steps):
        if n <= size:
            yield torch.arange(n)
            continue
        if len(order) < size:
            order = torch.cat([order, torch.randperm(n, generator=generator)])
        yield order[:size]
        order = order[size:]


# -- analysis -------------------------------------------------------------------------------------------------
def neuron_coefficients(
    view: ModelView, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor, neurons: Sequence[tuple[int, int]]
) -> torch.Tensor:
    """END coefficients of (layer, neuron) pairs: [row, neuron], one forward pass."""
    layers = sorted({int(layer) for layer, _ in neurons})
    coef = end_coefficients(view, ids, mask, end, layers)  # [row, len(layers), d_mlp]
    width = coef.shape[-1]
    bad = [(layer, k) for layer, k in neurons if not 0 <= int(k) < width]
    if bad:
        raise ConfigError(f"neurons {bad[:3]} do not exist: neuron indices are 0..{width - 1}")
    cols = torch.tensor([[layers.index(int(layer)), int(k)] for layer, k in neurons], dtype=torch.long)
    return coef[:, cols[:, 0], cols[:, 1]]  # [row, neuron]


def coefficient_change(
    handle: ModelHandle,
    adapter: LoraAdapter | str | Path,
    ids: torch.Tensor,
    mask: torch.Tensor,
    end: torch.Tensor,
    neurons: Sequence[tuple[int, int]],
    answer_ids: torch.Tensor | None = None,
) -> CoefficientChange:
    """END coefficients of `neurons` on the base model and with `adapter` applied (the model is restored after).

    neurons: (layer, neuron) pairs, e.g. the top CNA neurons. With answer_ids, also each neuron's LI.
    """
    if not neurons:
        raise ConfigError("no neurons given; pass (layer, neuron) pairs such as the top CNA neurons")
    neurons = tuple((int(layer), int(k)) for layer, k in neurons)
    view = handle.view
    before = neuron_coefficients(view, ids, mask, end, neurons)
    li_before = None if answer_ids is None else _neuron_li(view, ids, mask, end, answer_ids, neurons)
    li_after = None
    with applied_lora(handle, adapter) as peft_model:
        after = neuron_coefficients(view, ids, mask, end, neurons)
        if answer_ids is not None:
            with _merged(peft_model):  # an adapted down projection changes the value vectors LI reads
                li_after = _neuron_li(view, ids, mask, end, answer_ids, neurons)
    return CoefficientChange(neurons, before, after, li_before, li_after)


@dataclass(frozen=True)
class _Prompts:
    """The right-padded prompts as the `log_increase.EndBatch` protocol."""

    ref_ids: torch.Tensor  # [row, pos]
    ref_mask: torch.Tensor  # [row, pos]
    end: torch.Tensor  # [row]


def _neuron_li(
    view: ModelView,
    ids: torch.Tensor,
    mask: torch.Tensor,
    end: torch.Tensor,
    answer_ids: torch.Tensor,
    neurons: tuple[tuple[int, int], ...],
) -> torch.Tensor:
    """LI of each (layer, neuron) for the answer token, with this run's own END scales: [row, neuron].

    `log_increase.neuron_li_from_states` for the chosen neurons only (it scores every neuron of a layer, which
    for a 49k vocabulary costs minutes on a CPU): logits(x + m_k v_k) = L0 + (m_k / (s t)) U_k, soft-cap and
    log-softmax exact.
    """
    from arithmech.neurons.log_increase import end_states, neuron_directions, run_scales
    from arithmech.neurons.readout import cap, final_norm, unembed_weight

    layers = sorted({layer for layer, _ in neurons})
    states = end_states(view, _Prompts(ids, mask, end), layers)
    scales = run_scales(view, states)
    norm = final_norm(view)
    w_u, b_u = unembed_weight(view, norm.gain.dtype)
    rows = torch.arange(len(end), device=w_u.device)
    target = answer_ids.to(w_u.device)
    s = scales.final.to(w_u.device)  # [row]
    out = torch.empty(len(end), len(neurons))
    for i, layer in enumerate(layers):
        cols = [j for j, (lay, _) in enumerate(neurons) if lay == layer]
        ks = torch.tensor([neurons[j][1] for j in cols], dtype=torch.long)
        base = norm.apply(states.mlp_in[:, i].to(w_u.device), s) @ w_u.T  # [row, d_vocab] before bias and cap
        base = base if b_u is None else base + b_u
        base_lp = cap(view, base).log_softmax(-1)[rows, target]  # [row]
        coef = states.coeff[:, i, ks].to(w_u.device)  # [row, neuron]
        a = coef / (s * scales.mlp_post[:, i].to(w_u.device))[:, None]  # [row, neuron]
        directions = neuron_directions(view, layer, norm)[ks.to(w_u.device)]  # [neuron, d_model]
        step = max(1, 2**25 // (len(end) * w_u.shape[0]))  # at most 2**25 logits at once
        for c in range(0, len(cols), step):
            u = directions[c : c + step] @ w_u.T  # [chunk, d_vocab]
            logits = base[:, None, :] + a[:, c : c + step, None] * u[None]  # [row, chunk, d_vocab]
            lp = cap(view, logits).log_softmax(-1)[rows, :, target]  # [row, chunk]
            out[:, cols[c : c + step]] = (lp - base_lp[:, None]).cpu().float()
    return out


@contextmanager
def _merged(peft_model: Any) -> Iterator[None]:
    """Merge the adapter into the base weights for the block; put the exact original weights back after.

    LI reads value vectors from the down projection's weight; merged, that weight is W + (alpha / r) B A.
    Unmerging subtracts in floating point, so the saved originals are copied back bit for bit.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    saved = [
        (p, p.detach().clone())
        for m in peft_model.modules()
        if isinstance(m, BaseTunerLayer)
        for p in m.get_base_layer().parameters(recurse=False)
    ]
    peft_model.merge_adapter()
    try:
        yield
    finally:
        peft_model.unmerge_adapter()
        with torch.no_grad():
            for p, original in saved:
                p.copy_(original)
