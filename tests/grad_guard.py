"""Which torch operations build an autograd graph while arithmech code runs, for the no-graph tests.

Background
----------
An analysis that only reads activations must run under `torch.no_grad()`: otherwise every operation on a
tensor that descends from a parameter with `requires_grad=True` is recorded for a backward pass that never
comes. On Llama-family models an activation read by a hook often has no parameter after it, so nothing shows;
on Gemma 2/3 the post-feedforward norm has a weight, the MLP update then requires grad and `.numpy()` fails
(issue #13). Memory grows with the graph on large models even where nothing fails.

`GradRecorder` is a `TorchFunctionMode`: inside the block, every torch function or Tensor method whose result
requires grad while grad mode is on is recorded, with the arithmech frames on the stack. Two kinds:

    graph     the result requires grad: a graph is being built;
    weights   a parameter with requires_grad=True is an input: the graph reaches the model's weights.

Only the functions that need gradients may build one (`GRAPH_ALLOWED`): attribution patching's one
forward/backward pass, the circuit stage's EAP and EAP-IG edge scores, and the two training loops; of those, only
the training loops may reach the weights (`WEIGHTS_ALLOWED`): attribution patching and the edge scores freeze the
parameters and differentiate the activations only.
Loading a model is allowed both (`from_pretrained` creates and ties the parameters; no activation is read).
`unexpected()` lists every other site.

Usage
-----
>>> with GradRecorder() as rec:
...     analyze_mlp(handle, cfg, run, out, quiet=True)
>>> assert not rec.unexpected(), rec.unexpected()
"""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

_SRC = "/src/arithmech/"

_LOADING = ("models/load.py", "load_model")  # from_pretrained creates and ties the parameters; no activations
GRAPH_ALLOWED = frozenset({
    ("patching/attribution.py", "end_gradients"),  # dm/da of every sender from one backward pass
    ("stages/circuit.py", "rank_edges"),  # EAP / EAP-IG: dm/d(receiver input) of every edge, weights frozen
    ("neurons/lora_train.py", "train_layer_lora"),  # the neurons stage's LoRA adapter
    ("finetune/train.py", "train"),  # the finetune stage
    _LOADING,
})  # fmt: skip
"""(file under src/arithmech, function): a graph may be built while one of these is on the stack."""

WEIGHTS_ALLOWED = frozenset({("neurons/lora_train.py", "train_layer_lora"), ("finetune/train.py", "train"), _LOADING})
"""Of those, the functions whose graph may reach parameters that require grad."""

_FLAG_ONLY = frozenset({"requires_grad_"})
"""Tensor methods that set a flag and build nothing (a context manager restoring requires_grad after a block)."""


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _arithmech_frames(frame: FrameType | None) -> list[tuple[str, str, int]]:
    """(file under src/arithmech, function, line) of each arithmech frame, innermost first."""
    out = []
    while frame is not None:
        name = frame.f_code.co_filename
        if _SRC in name:
            out.append((name.split(_SRC, 1)[1], frame.f_code.co_name, frame.f_lineno))
        frame = frame.f_back
    return out


class GradRecorder(TorchFunctionMode):
    """Records where graph-building operations ran inside the block (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[tuple[str, str]] = Counter()
        """(kind, "file:line function" of the innermost arithmech frame) -> operations not allowed there."""
        self.allowed: Counter[str] = Counter()
        """kind -> operations that ran inside an allowed function."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not torch.is_grad_enabled() or getattr(func, "__name__", "") in _FLAG_ONLY:
            return out
        if any(t.requires_grad for t in _tensors(out)):
            weights = any(isinstance(t, nn.Parameter) and t.requires_grad for t in _tensors((args, kwargs)))
            self._record("weights" if weights else "graph", sys._getframe(1))
        return out

    def _record(self, kind: str, frame: FrameType) -> None:
        frames = _arithmech_frames(frame)
        allowed = WEIGHTS_ALLOWED if kind == "weights" else GRAPH_ALLOWED
        if any((path, function) in allowed for path, function, _ in frames):
            self.allowed[kind] += 1
            return
        where = f"{frames[0][0]}:{frames[0][2]} {frames[0][1]}" if frames else "<outside arithmech>"
        self.sites[(kind, where)] += 1

    def unexpected(self) -> list[str]:
        """'kind file:line function (n ops)' of every site that built a graph it should not have."""
        return [f"{kind} {where} ({n} ops)" for (kind, where), n in self.sites.most_common()]
