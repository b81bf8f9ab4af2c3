"""Where a patched pass can start when a circuit differs from the clean run only from some layer on.

Background
    The exact edge oracle (`oracle.py`) patches one edge s -> r at a time and keeps every other edge clean. Two
    parts of such a run are the clean run itself, whatever the edge:
    - the layers below r's layer L_r: every receiver there keeps all its edges, so it reads the clean residual;
    - the positions before p0, the first position where the clean and counterfactual tokens differ (over a chunk
      of prompts): with causal attention every sender's clean and counterfactual outputs are equal there, so
      every swap term out(ablated) - out(clean) is zero, in every circuit.
    So the pass for the edges of r runs only layers L_r.. on positions p0.., from the clean residual entering L_r,
    attending to the clean run's keys and values of positions < p0 (`models/from_layer.run_from_layers`, the
    model's own forward with the rows joining at L_r, and `prefix_cache`). The swap terms of the senders below
    L_r, which r and the later receivers still read, come from the two plain runs: counterfactual minus clean
    sender outputs (`SenderOutputs`), at positions p0...

Usage
    >>> prefix = CleanPrefix(view, graph, chunk, cf)  # one clean run with its cache, one clean sender run
    >>> resid, _ = patched_end_resid(view, graph, ids, mask, keep, cf, start=prefix.start(layer))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache

from arithmech.circuits.batch import CircuitBatch
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.senders import SenderOutputs, collect_sender_outputs
from arithmech.models.from_layer import JoiningRows, run_from_layers
from arithmech.models.hooks import hooks
from arithmech.models.shared_prefix import full_cache, prefix_cache
from arithmech.models.view import ModelView, cache_kwarg


def first_difference(batch: CircuitBatch) -> int:
    """The first position where any prompt's clean and counterfactual tokens differ, at most the earliest END."""
    limit = int(batch.end.min())  # END itself must stay in every suffix
    differs = (batch.clean_ids[:, :limit] != batch.cf_ids[:, :limit]).any(dim=0).nonzero()  # [positions, 1]
    return int(differs[0, 0]) if len(differs) else limit


@dataclass(frozen=True)
class PassStart:
    """A patched pass that runs layers `layer`.. on positions `position`.. of a chunk of prompts."""

    layer: int
    position: int
    input_ids: torch.Tensor  # [prompt, pos - position]: the clean tokens the pass runs on
    attention_mask: torch.Tensor  # [prompt, pos]: the whole mask, prefix included, as for a cached call
    resid: torch.Tensor  # [prompt, pos - position, d_model]: the clean residual entering `layer`
    prefix: Cache | None  # clean keys/values of positions < position (None when position is 0)
    terms: list[tuple[int, torch.Tensor]]
    """Swap terms of the senders below `layer`: (first sender, [senders, prompt, pos - position, d_model]),
    shared by every circuit of the pass."""
    first_receiver: int
    """Receivers before this one read only senders below `layer`: a circuit must keep all their edges."""

    def ablated(self, ablated: SenderOutputs) -> SenderOutputs:
        """The ablated outputs at the pass's positions (a mean, one position for all, stays as it is)."""
        return ablated.positions_from(self.position)

    def run(self, view: ModelView, circuits: int) -> None:
        """The model's forward for `circuits` x prompts rows (circuit-major) joining at `layer`; the caller's hooks
        read the result."""
        prompts = int(self.input_ids.shape[0])
        which = torch.arange(prompts).repeat(circuits)  # [row]: each row's prompt
        rows = JoiningRows(prompt=which, layer=torch.full_like(which, self.layer), resid=self.resid[which])
        run_from_layers(view, rows, self.input_ids, self.attention_mask, self.prefix)


class CleanPrefix:
    """The clean run of a chunk of prompts, kept so that patched passes can start at any layer (see above)."""

    def __init__(self, view: ModelView, graph: CircuitGraph, chunk: CircuitBatch, cf: SenderOutputs) -> None:
        self.view, self.graph = view, graph
        self.position = first_difference(chunk)
        self.mask = chunk.mask
        self.input_ids = chunk.clean_ids[:, self.position :]
        device = view.o_proj(0).weight.device
        n_layers = view.dims.n_layers
        inputs: list[torch.Tensor | None] = [None] * n_layers
        cache = full_cache()

        def keep(layer: int) -> Any:
            def fn(_module: Any, args: tuple[Any, ...]) -> None:
                inputs[layer] = args[0][:, self.position :].detach()

            return fn

        with torch.no_grad(), hooks(pre=[(view.attn_norm(layer), keep(layer)) for layer in range(n_layers)]):
            view.model.base_model(
                input_ids=chunk.clean_ids.to(device), attention_mask=chunk.mask.to(device), use_cache=True,
                **{cache_kwarg(view.model.base_model): cache},
            )  # fmt: skip
        self.layer_inputs = inputs
        prompts = torch.arange(len(chunk))
        self.prefix = prefix_cache(view, cache, prompts, self.position) if self.position else None
        clean = collect_sender_outputs(view, chunk.clean_ids, chunk.mask)
        p = self.position
        self.terms: list[tuple[int, torch.Tensor]] = [(0, (cf.embed - clean.embed)[None, :, p:])]
        for layer in range(n_layers):
            heads = cf.head_outputs(view, layer) - clean.head_outputs(view, layer)  # [head, prompt, pos, d_model]
            mlp = (cf.mlp_out[layer] - clean.mlp_out[layer])[None]  # [1, prompt, pos, d_model]
            self.terms += [(graph.head_sender(layer, 0), heads[:, :, p:]), (graph.mlp_sender(layer), mlp[:, :, p:])]

    def start(self, layer: int) -> PassStart:
        """The start of a pass whose circuits keep every edge into the receivers below `layer`."""
        layer = min(layer, self.view.dims.n_layers - 1)  # the logits' receiver: from the last layer
        below = self.graph.head_sender(layer, 0)  # senders before `layer`; at layer 0 its own hook adds the embedding's
        terms = [(s, t) for s, t in self.terms if s < below] if layer else []
        resid = self.layer_inputs[layer]
        assert resid is not None
        return PassStart(
            layer=layer, position=self.position, input_ids=self.input_ids, attention_mask=self.mask, resid=resid,
            prefix=self.prefix, terms=terms,
            first_receiver=self.graph.layer_receivers(layer).start,
        )  # fmt: skip
