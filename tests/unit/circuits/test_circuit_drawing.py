"""The circuit drawing: valid SVG, one titled path per edge, colour by sign, q/k/v told apart, no address inline."""

from __future__ import annotations

import random
import re
from xml.etree import ElementTree

import pytest
import torch

from arithmech.circuits.faithfulness import SweepResult
from arithmech.circuits.graph import CircuitGraph
from arithmech.report.circuit_drawing import DASHES, NEGATIVE, POSITIVE, circuit_svg, inline_svg
from arithmech.stages.circuit import drawn_circuit
from arithmech.stages.circuit_config import DRAWN_DEFAULT, DRAWN_MAX

SVG = "{http://www.w3.org/2000/svg}"


def _paths(svg: str) -> list[ElementTree.Element]:
    root = ElementTree.fromstring(svg.encode())
    return [p for p in root.iter(f"{SVG}path") if p.get("class") == "edge"]


@pytest.mark.parametrize("n", [1, 100, 500])
def test_one_titled_path_per_edge_coloured_by_sign(n: int) -> None:
    graph = CircuitGraph(30, 9)  # the default model's graph
    rng = random.Random(n)
    edges = [(name, rng.uniform(-1, 1)) for name in rng.sample(graph.edge_names, n)]
    svg = circuit_svg(edges, 30, 9, "title with <odd> & characters")
    paths = _paths(svg)
    assert len(paths) == n
    by_name = {}
    for path in paths:
        title = path.find(f"{SVG}title")
        assert title is not None and title.text is not None
        name, _, score = title.text.partition(": score ")
        by_name[name] = (float(score), path)
    assert set(by_name) == {name for name, _ in edges}  # MIB's names, <q> and all, back from the XML
    for name, score in edges:
        written, path = by_name[name]
        assert written == pytest.approx(score, rel=1e-3)
        assert path.get("stroke") == (POSITIVE if score >= 0 else NEGATIVE)
        role = name[-2] if name.endswith(">") else ""
        assert path.get("stroke-dasharray") == (DASHES.get(role) or None)


def test_width_grows_with_the_score_and_q_k_v_end_apart() -> None:
    edges = [("input->a1.h0<q>", 0.1), ("input->a1.h0<k>", -1.0), ("input->a1.h0<v>", 0.5), ("m0->logits", 0.0)]
    paths = {p.find(f"{SVG}title").text.split(":")[0]: p for p in _paths(circuit_svg(edges, 2, 2, ""))}  # type: ignore[union-attr]
    widths = {name: float(p.get("stroke-width", 0)) for name, p in paths.items()}
    assert widths["m0->logits"] < widths["input->a1.h0<q>"] < widths["input->a1.h0<v>"] < widths["input->a1.h0<k>"]
    ends = {name[-2]: re.findall(r"[-\d.]+", p.get("d", ""))[-2] for name, p in paths.items() if name.endswith(">")}
    assert float(ends["q"]) < float(ends["k"]) < float(ends["v"])  # q left, k middle, v right of the head


@pytest.mark.parametrize("edges", [[], [("a0.h1->a1.h0<q>", 0.5)], [("input->logits", 1.0)]])
def test_the_input_and_logits_bars_are_labelled(edges: list[tuple[str, float]]) -> None:
    """Issue 34.18: the two ends of every path are named beside their bars, whether or not an edge touches them."""
    root = ElementTree.fromstring(circuit_svg(edges, 2, 2, "").encode())
    labels = {t.text: t for t in root.iter(f"{SVG}text") if t.get("class") == "end-label"}
    assert set(labels) == {"input", "logits"}
    bars = {r.find(f"{SVG}title").text.split(":")[0]: r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title")
            is not None}  # type: ignore[union-attr]  # fmt: skip
    for name, label in labels.items():
        bar = bars[name]
        right = float(bar.get("x", 0)) + float(bar.get("width", 0))
        assert float(label.get("x", 0)) > right  # beside the bar, on its right
        assert abs(float(label.get("y", 0)) - float(bar.get("y", 0))) < 10  # on its row
    assert float(labels["logits"].get("y", 0)) < float(labels["input"].get("y", 0))  # logits at the top


def test_inline_markup_names_no_address() -> None:
    svg = circuit_svg([("input->logits", 1.0)], 1, 1, "")
    assert "http" in svg  # the file itself declares its namespace, so that it opens on its own
    inline = inline_svg(svg)
    assert inline.startswith("<svg") and "http" not in inline and "<?xml" not in inline


def _sweep(f_signed: tuple[float, ...], edges: tuple[int, ...]) -> SweepResult:
    n = len(f_signed)
    return SweepResult(percents=(1.0, 10.0, 100.0)[:n], edges=edges, f_signed=f_signed, f_absolute=f_signed,
                       m_signed=f_signed, m_absolute=f_signed, m_full=1.0, m_empty=0.0)  # fmt: skip


def test_drawn_size_default_is_the_smallest_faithful_circuit() -> None:
    graph = CircuitGraph(3, 4)
    scores = graph.to_dense(torch.linspace(-1, 1, graph.n_edges))
    drawing = drawn_circuit(graph, scores, None, _sweep((0.5, 0.85, 1.0), (2, 26, 262)))
    assert len(drawing.edges) == 26 and "f >= 0.8 (10 % of edges)" in drawing.why
    top = [graph.edge_index.tolist()[i] for i in range(graph.n_edges - 26, graph.n_edges)]  # the largest scores
    assert sorted(map(tuple, top)) == sorted(drawing.edges)
    assert len(drawn_circuit(graph, scores, 1.0, None).edges) == 2  # --draw-percent 1: int(1 % of 262)
    assert len(drawn_circuit(graph, scores, None, _sweep((0.1, 0.2, 0.7), (2, 26, 262))).edges) == DRAWN_DEFAULT


def test_at_most_drawn_max_edges() -> None:
    graph = CircuitGraph(30, 9)
    scores = graph.to_dense(torch.randn(graph.n_edges))
    drawing = drawn_circuit(graph, scores, 10.0, None)
    assert len(drawing.edges) == DRAWN_MAX and drawing.circuit_edges == 12_321
    assert f"its {DRAWN_MAX} strongest drawn" in drawing.why
