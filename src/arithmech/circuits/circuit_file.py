"""edges.json: a scored circuit in MIB's file format, written and read back.

Format (EAP-IG's `Graph.to_json`, which MIB's circuit track reads):
    {"cfg":   {"n_layers", "n_heads", "n_key_value_heads", "parallel_attn_mlp", "d_model"},
     "nodes": {"input": true, "a0.h0": false, ..., "logits": true},              node name -> in_graph
     "edges": {"input->a0.h0<q>": {"score": 0.12, "in_graph": true}, ...}}       every edge of the graph
A node is in the graph when an edge in the graph touches it. Reading accepts a node value written as
{"in_graph": bool} too; a file whose cfg does not match the model, or that names an edge the model's graph
lacks, is refused with one sentence.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech.circuits.graph import CircuitGraph
from arithmech.errors import ConfigError
from arithmech.runs import atomic_write_json

EDGES_FILE = "edges.json"
CFG_KEYS = ("n_layers", "n_heads", "parallel_attn_mlp", "d_model")
"""The cfg entries that must match the model for a circuit file to be read for it."""


@dataclass(frozen=True)
class CircuitFile:
    """What an edges.json holds: the graph's cfg, every edge's score and the circuit kept."""

    cfg: dict[str, Any]
    scores: torch.Tensor  # [receiver, sender], 0 off the edges
    in_graph: torch.Tensor  # [receiver, sender] bool

    def graph(self) -> CircuitGraph:
        return CircuitGraph(int(self.cfg["n_layers"]), int(self.cfg["n_heads"]), bool(self.cfg["parallel_attn_mlp"]))


def graph_cfg(graph: CircuitGraph, d_model: int, n_kv_heads: int) -> dict[str, Any]:
    return {
        "n_layers": graph.n_layers,
        "n_heads": graph.n_heads,
        "n_key_value_heads": n_kv_heads,
        "parallel_attn_mlp": graph.parallel,
        "d_model": d_model,
    }


def write_edges(
    path: str | os.PathLike[str], cfg: dict[str, Any], scores: torch.Tensor, in_graph: torch.Tensor
) -> None:
    """Write every edge's score and whether it is in the circuit, MIB's way."""
    graph = CircuitFile(cfg, scores, in_graph).graph()
    edge_scores = graph.to_edges(scores.float()).tolist()
    edge_in = graph.to_edges(in_graph.bool()).tolist()
    senders = in_graph.bool().any(0).tolist()  # [sender]: sends an edge in the graph
    receivers = in_graph.bool().any(1)  # [receiver]
    nodes = {name: bool(senders[s]) for s, name in enumerate(graph.sender_names)}
    for r, name in enumerate(graph.receiver_names):
        node = name.split("<")[0]
        nodes[node] = nodes.get(node, False) or bool(receivers[r])
    edges = {
        name: {"score": float(score), "in_graph": bool(kept)}
        for name, score, kept in zip(graph.edge_names, edge_scores, edge_in, strict=True)
    }
    atomic_write_json(path, {"cfg": cfg, "nodes": nodes, "edges": edges})


def read_edges(path: str | os.PathLike[str]) -> CircuitFile:
    """Read an edges.json (this package's or MIB's); ConfigError for a file that is not one."""
    source = Path(path)
    try:
        data = json.loads(source.read_text())
        cfg = data["cfg"]
        graph = CircuitGraph(int(cfg["n_layers"]), int(cfg["n_heads"]), bool(cfg.get("parallel_attn_mlp", False)))
        cfg = {**cfg, "parallel_attn_mlp": graph.parallel}
        edges = data["edges"].items()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(
            f"{str(source)!r} is not a circuit file ({type(err).__name__}: {err}); give an edges.json written by "
            "`arithmech circuit` or MIB's tools"
        ) from None
    scores = torch.zeros(graph.n_receivers, graph.n_senders)
    in_graph = torch.zeros(graph.n_receivers, graph.n_senders, dtype=torch.bool)
    for name, info in edges:
        receiver, sender = graph.parse_edge(name)
        score = info.get("score")
        scores[receiver, sender] = float("nan") if score is None else float(score)
        in_graph[receiver, sender] = bool(info.get("in_graph", False))
    return CircuitFile(cfg=cfg, scores=scores, in_graph=in_graph)


def check_matches(circuit: CircuitFile, cfg: dict[str, Any], source: str) -> None:
    """ConfigError when the circuit file's cfg differs from the model's on any of CFG_KEYS."""
    for key in CFG_KEYS:
        if key in circuit.cfg and circuit.cfg[key] != cfg[key]:
            raise ConfigError(
                f"the circuit file {source!r} was made for a model with {key} = {circuit.cfg[key]}, but the loaded "
                f"model has {cfg[key]}; pass the --model it was made with, or score this model anew"
            )
