"""LoRA adapters kept apart from the model: saved as a peft folder, applied for one block, then removed.

Background
    A LoRA adapter (Hu et al. 2022) adds a trainable low-rank update to chosen linear projections. peft injects
    it into the model in place, wrapping each target module. The LoRA analysis (METHODS.md sec. 6) must read
    the base model before and after, so here an adapter lives apart from any model: a `LoraAdapter` is its peft
    config plus its weights on the CPU, trained here (`lora_train.py`) or read from a user's peft adapter
    folder, and it touches the model only inside `applied_lora`.

Formula
    A projection W [out, in] with an adapter of rank r computes

        W x + (alpha / r) * B (A x)        A [r, in], B [out, r]

    so B = 0 (a fresh adapter) leaves every output exactly as it was. GPT-2's Conv1D stores W transposed;
    peft's fan_in_fan_out handles it.

The base model is left as it was
    `applied_lora` injects the adapter for the duration of a block and, in `finally`, unloads it (the original
    modules go back in place, unmerged) and restores every parameter's requires_grad, the train/eval mode and
    the config attributes peft touches; the caller's global RNG is not consumed. `injected` is that guard for
    any peft model builder (training uses it to inject a fresh adapter).

Usage
    >>> adapter.save("runs/lora-l20")                                   # a peft adapter folder
    >>> with applied_lora(handle, "runs/lora-l20"):                     # or the LoraAdapter itself
    ...     logits = handle.view.end_logits(ids, mask, end)             # [row, d_vocab] with the adapter
    >>> # here the model is exactly the base model again

References: Hu et al., "LoRA", ICLR 2022; Yu & Ananiadou, EMNLP 2024 (arXiv 2409.14144); METHODS.md sec. 6.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from arithmech.errors import ConfigError
from arithmech.models.load import ModelHandle
from arithmech.runs import atomic_open, atomic_write_text

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


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

    with injected(handle, build) as peft_model:
        yield peft_model


@contextmanager
def injected(handle: ModelHandle, build: Callable[[nn.Module], Any]) -> Iterator[Any]:
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
