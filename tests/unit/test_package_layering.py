"""Calls go downward only: no two parts of arithmech import each other, directly or around a loop (issue 21.6).

A part is a subpackage of src/arithmech (analysis, neurons, patching, knockout, models, ...) or a top-level module
(pipeline, lineage, preflight, ...). Imports are read from the source with `ast`, also those inside functions
(a lazy import still makes the importing part depend on the imported one), so the test needs no import of
arithmech itself. The order of the parts, from the style guide:
cli -> stages -> {analysis, neurons, knockout, report} -> {patching, finetune, evaluate} -> {models, data}.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "arithmech"


def _part(path: Path) -> str:
    rel = path.relative_to(SRC).parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def _imported_parts(node: ast.AST) -> Iterator[str]:
    """The parts of arithmech that one import statement names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module] if node.module != "arithmech" else [f"arithmech.{a.name}" for a in node.names]
    else:
        return
    for name in names:
        parts = name.split(".")
        if parts[0] == "arithmech" and len(parts) > 1:
            exists = (SRC / parts[1]).is_dir() or (SRC / f"{parts[1]}.py").is_file()
            yield parts[1] if exists else "__init__"  # `from arithmech import __version__`


def import_edges() -> dict[tuple[str, str], set[str]]:
    """(importer, imported) part -> the files that make the edge."""
    edges: dict[tuple[str, str], set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        source = _part(path)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in _imported_parts(node):
                if target != source:
                    edges.setdefault((source, target), set()).add(str(path.relative_to(SRC)))
    return edges


def loops(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one part (Tarjan), each sorted."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_loop_finder_finds_loops() -> None:
    assert loops({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    assert loops({("a", "b"), ("b", "c")}) == []


def test_no_part_of_arithmech_imports_itself_around_a_loop() -> None:
    edges = import_edges()
    found = loops(set(edges))
    detail = {
        " <-> ".join(group): sorted(f"{a} -> {b}: {sorted(edges[a, b])}" for a, b in edges if {a, b} <= set(group))
        for group in found
    }
    assert not found, f"import loops between parts of arithmech: {detail}"


def test_analyses_do_not_import_each_other() -> None:
    """analysis and neurons are siblings; what both need (the fixed-norm readout, the down projection, the prefix
    runner) lives in models/."""
    edges = import_edges()
    sideways = {edge: sorted(edges[edge]) for edge in [("analysis", "neurons"), ("neurons", "analysis")]
                if edge in edges}  # fmt: skip
    assert not sideways, sideways


def test_reports_read_run_folders_without_the_pipeline() -> None:
    """A report only reads files: it imports neither the pipeline, nor a stage, nor the command line."""
    edges = import_edges()
    above = {edge: sorted(edges[edge]) for edge in edges if edge[0] == "report" and edge[1] in
             {"pipeline", "stages", "cli", "api"}}  # fmt: skip
    assert not above, above
