"""edges.json held against what MIB's own code writes and reads, key by key (not against a docstring).

The reference below is EAP-IG's `Graph.from_model` and `Graph.to_json` (hannamw/EAP-IG, src/eap/graph.py; MIB's
circuit track loads circuit files with that package's `Graph.from_json`, MIB-circuit-track run_evaluation.py),
rewritten without torch or TransformerLens for a tiny cfg: the same loops, in the same order, building the same
dicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from arithmech.circuits.circuit_file import graph_cfg, mib_edge_order, read_edges, write_edges
from arithmech.circuits.graph import CircuitGraph
from arithmech.errors import ConfigError


def mib_graph(cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Node and edge names in the order `Graph.from_model` inserts them into graph.nodes and graph.edges."""
    nodes, edges, residual = ["input"], [], ["input"]
    for layer in range(cfg["n_layers"]):
        attn = [f"a{layer}.h{head}" for head in range(cfg["n_heads"])]
        mlp = f"m{layer}"
        nodes += [*attn, mlp]
        if cfg["parallel_attn_mlp"]:
            for node in residual:
                edges += [f"{node}->{a}<{letter}>" for a in attn for letter in "qkv"]
                edges.append(f"{node}->{mlp}")
            residual += [*attn, mlp]
        else:
            for node in residual:
                edges += [f"{node}->{a}<{letter}>" for a in attn for letter in "qkv"]
            residual += attn
            edges += [f"{node}->{mlp}" for node in residual]
            residual.append(mlp)
    edges += [f"{node}->logits" for node in residual]
    return [*nodes, "logits"], edges


def mib_to_json(cfg: dict[str, Any], score: dict[str, float], kept: set[str]) -> dict[str, Any]:
    """`Graph.to_json` of an edge-level graph (no node or neuron scores) after `apply_topn`/`apply_threshold` with
    reset=True: d = {'cfg': dict(self.cfg)}; node_dict[name] = {'in_graph': bool(node.in_graph)} (a node is in when it
    has an edge out and one in, the input needing none in; LogitNode.in_graph is always True); edge_dict[name] =
    {'score': edge.score.item(), 'in_graph': bool(edge.in_graph)}."""
    nodes, edges = mib_graph(cfg)
    out = {e.split("->")[0] for e in kept}
    into = {e.split("->")[1].split("<")[0] for e in kept} | {"input"}
    node_dict = {name: {"in_graph": name == "logits" or (name in out and name in into)} for name in nodes}
    edge_dict = {name: {"score": score[name], "in_graph": name in kept} for name in edges}
    return {"cfg": dict(cfg), "nodes": node_dict, "edges": edge_dict}


def mib_from_json(data: dict[str, Any]) -> None:
    """What `Graph.from_json` indexes: node_dict['in_graph'] of every node but the logits, info['score'] and
    info['in_graph'] of every edge."""
    assert all(k in data for k in ("cfg", "nodes", "edges")), "Bad input JSON format - Missing keys"
    for name, node_dict in data["nodes"].items():
        if name != "logits":
            bool(node_dict["in_graph"])
    for info in data["edges"].values():
        float(info["score"]), bool(info["in_graph"])


def _same_shape(ours: Any, theirs: Any, where: str = "") -> None:
    """The same keys in the same order at every level, and the same value types."""
    assert type(ours) is type(theirs), (where, ours, theirs)
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs), where
        for key in theirs:
            _same_shape(ours[key], theirs[key], f"{where}.{key}")


@pytest.mark.parametrize("parallel", [False, True])
def test_edges_json_is_what_mibs_to_json_writes(tmp_path: Path, parallel: bool) -> None:
    graph = CircuitGraph(2, 2, parallel)
    cfg = graph_cfg(graph, 8)
    assert cfg == {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": parallel, "d_model": 8}  # from_model's order
    scores = graph.to_dense(torch.linspace(-1, 1, graph.n_edges)) + 0.1 * torch.rand(graph.n_receivers,
                                                                                     graph.n_senders)  # fmt: skip
    kept = torch.zeros_like(scores, dtype=torch.bool)
    kept[graph.head_receiver(1, "v", 0), graph.head_sender(0, 1)] = True  # a0.h1 -> a1.h0<v>: a0.h1 has no input edge
    kept[graph.logits_receiver, graph.mlp_sender(1)] = True  # m1 -> logits
    kept[graph.mlp_receiver(1), 0] = True  # input -> m1
    write_edges(tmp_path / "edges.json", cfg, scores, kept)
    ours = json.loads((tmp_path / "edges.json").read_text())

    names = {graph.edge_name(i): i for i in range(graph.n_edges)}
    flat_scores, flat_kept = graph.to_edges(scores.float()), graph.to_edges(kept)
    theirs = mib_to_json(cfg, {n: float(flat_scores[i].item()) for n, i in names.items()},
                         {n for n, i in names.items() if bool(flat_kept[i])})  # fmt: skip
    _same_shape(ours, theirs)
    assert ours == theirs  # values too: scores as float32 .item(), nodes in as apply_topn sets them
    assert ours["nodes"]["a0.h1"] == {"in_graph": False} and ours["nodes"]["m1"] == {"in_graph": True}
    mib_from_json(ours)


def test_the_published_circuit_file_orders_cfg_nodes_and_edges_like_ours() -> None:
    """MIB's example circuit circuits/ioi-eap-ig.json (GPT-2 small; MIB-circuit-track, seen in its fork
    yanivnik/MIB-shared-task) opens with these keys, in this order."""
    graph = CircuitGraph(12, 12)
    assert list(graph_cfg(graph, 768).items()) == [("n_layers", 12), ("n_heads", 12), ("parallel_attn_mlp", False),
                                                   ("d_model", 768)]  # fmt: skip
    published = [f"input->a0.h{h}<{x}>" for h in range(12) for x in "qkv"] + ["input->m0"]
    published += [f"a0.h{h}->m0" for h in range(12)] + [f"input->a1.h0<{x}>" for x in "qkv"]
    order = [f"{graph.sender_names[s]}->{graph.receiver_names[r]}" for r, s in mib_edge_order(graph)]
    assert order[: len(published)] == published
    assert sorted(order) == sorted(graph.edge_names)  # every edge once


def test_bare_boolean_nodes_are_read_though_mibs_loader_refuses_them(tmp_path: Path) -> None:
    graph = CircuitGraph(2, 2)
    cfg = graph_cfg(graph, 8)
    scores = graph.to_dense(torch.randn(graph.n_edges))
    kept = graph.to_dense((torch.arange(graph.n_edges) % 3 == 0).float()).bool()
    write_edges(tmp_path / "edges.json", cfg, scores, kept)
    data = json.loads((tmp_path / "edges.json").read_text())
    data["nodes"] = {name: node["in_graph"] for name, node in data["nodes"].items()}  # the old way
    with pytest.raises(TypeError):
        mib_from_json(data)  # why edges.json no longer writes them
    (tmp_path / "bare.json").write_text(json.dumps(data))
    for name in ("edges.json", "bare.json"):
        stored = read_edges(tmp_path / name, cfg)
        assert torch.equal(stored.in_graph, kept) and stored.fully_scored
        torch.testing.assert_close(graph.to_edges(stored.scores), graph.to_edges(scores))


def test_a_file_of_another_graph_or_form_is_refused(tmp_path: Path) -> None:
    graph = CircuitGraph(2, 2)
    cfg = graph_cfg(graph, 8)
    base = {"cfg": cfg, "nodes": {"input": True}, "edges": {"input->a0.h0<q>": {"in_graph": True}}}

    def read(data: dict[str, Any], model_cfg: dict[str, Any] | None = cfg) -> Any:
        (tmp_path / "c.json").write_text(json.dumps(data))
        return read_edges(tmp_path / "c.json", model_cfg)

    stored = read(base)  # an edge without a score, the others absent: outside the circuit, unscored
    assert int(stored.in_graph.sum()) == 1 and not stored.fully_scored
    with pytest.raises(ConfigError, match="was made for a model with n_heads = 2"):
        read(base, {**cfg, "n_heads": 3})
    with pytest.raises(ConfigError, match="names node 'a5.h0'"):
        read({**base, "nodes": {"a5.h0": {"in_graph": True}}})
    with pytest.raises(ConfigError, match="edge 'a0.h0->a0.h1<q>' is not in the graph"):
        read({**base, "edges": {"a0.h0->a0.h1<q>": {"score": 1.0, "in_graph": True}}})
    with pytest.raises(ConfigError, match="is not a circuit file"):
        read({**base, "nodes": {"input": "yes"}})
