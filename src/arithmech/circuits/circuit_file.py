"""edges.json: a scored circuit in MIB's file format, written and read back.

Format: what EAP-IG's `Graph.to_json` writes and `Graph.from_json` reads (hannamw/EAP-IG, src/eap/graph.py; MIB's
circuit track loads circuit files with `Graph.from_json`, run_evaluation.py), key by key:
    {"cfg":   {"n_layers": 30, "n_heads": 9, "parallel_attn_mlp": false, "d_model": 576},
     "nodes": {"input": {"in_graph": true}, "a0.h0": {"in_graph": false}, ..., "m0": {...}, ..., "logits": {...}},
     "edges": {"input->a0.h0<q>": {"score": 0.12, "in_graph": true}, ...}}
cfg holds the four entries `Graph.from_model` copies from a HookedTransformer's config, in its order (int, int,
bool, int; the key/value head count is not among them: MIB's graph has q, k and v edges per query head). Nodes
come in `from_model`'s order: input, per layer its heads then its MLP, logits last; each is {"in_graph": bool}
(`to_json` adds "score" only for node-level scores, which edge circuits do not have). Edges come in
`from_model`'s insertion order (`mib_edge_order`), each {"score": float, "in_graph": bool}. The nodes' flags
follow `Graph.apply_topn`: a node is in the graph when the circuit holds an edge out of it and one into it (the
input needs none in; the logits are always in); edges are written as chosen, not pruned.

Reading accepts MIB's files and this package's, including files whose nodes are bare booleans ("a0.h0": true, as
an earlier version of this module wrote them and `from_json`'s docstring describes them, though `from_json` itself
reads node["in_graph"]). Edges a file leaves out are outside the circuit and unscored. Against a model's graph
(`read_edges(path, cfg)`) a cfg that differs, or a node or edge name the graph lacks, is refused with one sentence.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech.circuits.graph import ROLES, CircuitGraph
from arithmech.errors import ConfigError
from arithmech.runs import atomic_write_json

EDGES_FILE = "edges.json"
CFG_KEYS = ("n_layers", "n_heads", "parallel_attn_mlp", "d_model")
"""The cfg `Graph.from_model` writes, in its order; all must match the model for a circuit file to be read for it."""


@dataclass(frozen=True)
class CircuitFile:
    """What an edges.json holds: the graph's cfg, every edge's score and the circuit kept."""

    cfg: dict[str, Any]
    scores: torch.Tensor  # [receiver, sender], NaN where the file gives no score (and off the edges)
    in_graph: torch.Tensor  # [receiver, sender] bool

    def graph(self) -> CircuitGraph:
        return CircuitGraph(int(self.cfg["n_layers"]), int(self.cfg["n_heads"]), bool(self.cfg["parallel_attn_mlp"]))

    @property
    def fully_scored(self) -> bool:
        """Whether the file gives a score to every edge of its graph (a ranking to sweep)."""
        graph = self.graph()
        return bool(graph.to_edges(self.scores).isfinite().all())


def graph_cfg(graph: CircuitGraph, d_model: int) -> dict[str, Any]:
    """The cfg of edges.json, as `Graph.from_model` builds it from a HookedTransformer."""
    return {"n_layers": graph.n_layers, "n_heads": graph.n_heads, "parallel_attn_mlp": graph.parallel,
            "d_model": d_model}  # fmt: skip


def mib_edge_order(graph: CircuitGraph) -> list[tuple[int, int]]:
    """(receiver, sender) of every edge in the order `Graph.from_model` adds them: per layer, each sender before
    it (the residual stream so far: input, earlier heads and MLPs) to each head's q, k, v (and, with parallel
    blocks, to the MLP right after); with sequential blocks then every sender, the layer's heads included, to the
    MLP; last every sender to the logits."""
    order: list[tuple[int, int]] = []
    for layer in range(graph.n_layers):
        mlp = graph.mlp_receiver(layer)
        for sender in range(1 + layer * graph.per_layer):
            for head in range(graph.n_heads):
                order += [(graph.head_receiver(layer, role, head), sender) for role in ROLES]
            if graph.parallel:
                order.append((mlp, sender))
        if not graph.parallel:
            order += [(mlp, sender) for sender in range(graph.senders_before(mlp))]
    return order + [(graph.logits_receiver, sender) for sender in range(graph.n_senders)]


def node_flags(graph: CircuitGraph, in_graph: torch.Tensor) -> dict[str, bool]:
    """Node name -> in_graph as `Graph.apply_topn` sets it: an edge out of the node and one into it (the input
    needs none in), the logits always."""
    keep = in_graph.bool() & graph.valid
    sends = keep.any(0)  # [sender]
    fed = keep.any(1)  # [receiver]
    has_input = torch.zeros(graph.n_senders, dtype=torch.bool)
    has_input[0] = True
    for receiver in range(graph.n_receivers - 1):  # a node is fed when any of its inputs (q, k, v) is
        layer, offset = divmod(receiver, graph.receivers_per_layer)
        head = offset % graph.n_heads
        node = graph.mlp_sender(layer) if offset == 3 * graph.n_heads else graph.head_sender(layer, head)
        has_input[node] |= fed[receiver]
    flags = (sends & has_input).tolist()
    return {**{name: bool(flags[s]) for s, name in enumerate(graph.sender_names)}, "logits": True}


def write_edges(
    path: str | os.PathLike[str], cfg: dict[str, Any], scores: torch.Tensor, in_graph: torch.Tensor
) -> None:
    """Write every edge's score and whether it is in the circuit, as `Graph.to_json` does."""
    graph = CircuitFile(cfg, scores, in_graph).graph()
    names = graph.sender_names + ["logits"]
    receivers = graph.receiver_names
    flags = node_flags(graph, in_graph)
    score, kept = scores.float().tolist(), in_graph.bool().tolist()
    edges = {
        f"{graph.sender_names[s]}->{receivers[r]}": {"score": float(score[r][s]), "in_graph": bool(kept[r][s])}
        for r, s in mib_edge_order(graph)
    }
    nodes = {name: {"in_graph": flags[name]} for name in names}
    atomic_write_json(path, {"cfg": {key: cfg[key] for key in CFG_KEYS}, "nodes": nodes, "edges": edges})


def _flag(value: Any) -> bool:
    """A node's in_graph: MIB's {"in_graph": bool, ...} or a bare bool; TypeError for anything else."""
    flag = value.get("in_graph") if isinstance(value, dict) else value
    if not isinstance(flag, bool):
        raise TypeError(f"a node value is {value!r}, neither true/false nor {{\"in_graph\": true/false}}")
    return flag


def read_edges(path: str | os.PathLike[str], model_cfg: dict[str, Any] | None = None) -> CircuitFile:
    """Read an edges.json (this package's or MIB's); ConfigError for a file that is not one and, given the model's
    cfg, for one made for another graph (its cfg, or a node or edge name the model's graph lacks)."""
    source = Path(path)
    try:
        data = json.loads(source.read_text())
        cfg = dict(data["cfg"])
        cfg = {**cfg, "n_layers": int(cfg["n_layers"]), "n_heads": int(cfg["n_heads"]),
               "parallel_attn_mlp": bool(cfg.get("parallel_attn_mlp", False))}  # fmt: skip
        nodes, edges = dict(data.get("nodes") or {}), dict(data["edges"])
        for value in nodes.values():
            _flag(value)
        if not all(isinstance(info, dict) for info in edges.values()):
            raise TypeError("an edge value is not an object {\"score\": ..., \"in_graph\": ...}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(
            f"{str(source)!r} is not a circuit file ({type(err).__name__}: {err}); give an edges.json written by "
            "`arithmech circuit` or MIB's tools"
        ) from None
    if model_cfg is not None:
        check_matches(cfg, model_cfg, str(source))
    graph = CircuitFile(cfg, torch.zeros(0), torch.zeros(0)).graph()
    unknown = sorted(set(nodes) - set(graph.node_names))
    if unknown:
        raise ConfigError(
            f"the circuit file {str(source)!r} names node {unknown[0]!r}, which the graph of {graph.n_layers} layers "
            f"x {graph.n_heads} heads lacks; give a circuit file made for this model"
        )
    scores = torch.full((graph.n_receivers, graph.n_senders), float("nan"))
    in_graph = torch.zeros(graph.n_receivers, graph.n_senders, dtype=torch.bool)
    for name, info in edges.items():
        receiver, sender = graph.parse_edge(name)
        score = info.get("score")
        scores[receiver, sender] = float("nan") if score is None else float(score)
        in_graph[receiver, sender] = bool(info.get("in_graph", False))
    return CircuitFile(cfg=cfg, scores=scores, in_graph=in_graph)


def check_matches(file_cfg: dict[str, Any], cfg: dict[str, Any], source: str) -> None:
    """ConfigError when the circuit file's cfg differs from the model's on any of CFG_KEYS it gives."""
    for key in CFG_KEYS:
        if key in file_cfg and file_cfg[key] != cfg[key]:
            raise ConfigError(
                f"the circuit file {source!r} was made for a model with {key} = {file_cfg[key]}, but the loaded "
                f"model has {cfg[key]}; pass the --model it was made with, or score this model anew"
            )
