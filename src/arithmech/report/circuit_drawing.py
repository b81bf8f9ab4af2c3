"""A circuit drawn as a layered graph in SVG: one path per edge, named and scored in its tooltip.

Why SVG written here, not a matplotlib figure: the report must stay self-contained and show an edge's name and
score on hover with no script. An inline SVG whose every edge carries a <title> gives native tooltips, and a
few hundred thin paths stay a small file.

Layout (MIB's graph, `circuits/graph.py`)
    rows        the input at the bottom; per layer l a row of its heads a{l}.h0 .. side by side, and above it,
                in a column right of the heads, its MLP m{l}; the logits at the top.
    nodes       nodes of the circuit are dark and named in their tooltip (and beside them, up to LABELLED_MAX
                of them); the others are light grey, so the grid of the model stays readable without competing
                with the circuit. The input and logits bars are always named beside them.
    edges       a curve from the sender's top to the receiver's bottom; blue when the score is positive,
                vermillion when negative (Okabe-Ito), width growing with |score| (the largest 3.5 px), thin and
                translucent so 100-500 edges stay legible; the largest drawn last, on top.
    q / k / v   an edge into a head's query input ends at the head's left third and is solid, into its key
                input at the middle, dashed, into its value input at the right third, dotted.

Usage
    >>> svg = circuit_svg([("input->a0.h1<q>", 0.3), ("a0.h1->logits", -0.1)], n_layers=2, n_heads=4, title="")
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

POSITIVE, NEGATIVE = "#0072B2", "#D55E00"
DASHES = {"q": "", "k": "4 2", "v": "1 2"}
"""Stroke dash pattern of an edge by the head input it enters; edges into an MLP or the logits are solid."""
_ATTACH = {"q": -1 / 3, "k": 0.0, "v": 1 / 3}
"""Where on a head's width (from its centre, in widths) an edge into its q, k or v input ends."""
LABELLED_MAX = 60
"""Nodes of the circuit are named beside them when there are at most this many (more would overlap)."""
_NODE = re.compile(r"a(\d+)\.h(\d+)|m(\d+)|input|logits")
_SVG_NS = ' xmlns="http://www.w3.org/2000/svg"'


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


class _Layout:
    """Positions of the nodes of a model with `n_layers` layers of `n_heads` heads."""

    def __init__(self, n_layers: int, n_heads: int) -> None:
        self.n_layers, self.n_heads = n_layers, n_heads
        rows = 2 * n_layers + 1  # gaps between the input row (0) and the logits row (2L + 1)
        self.dy = min(28.0, max(10.0, 720.0 / rows))
        self.dx = 34.0 if n_heads <= 16 else max(9.0, 560.0 / n_heads)
        self.head_w = min(self.dx * 0.72, 24.0)
        self.left, self.top, self.bottom = 56.0, 72.0, 24.0
        self.mlp_x = self.left + n_heads * self.dx + self.head_w
        self.width = max(self.mlp_x + 2 * self.head_w, 560.0)
        self.height = self.top + rows * self.dy + self.bottom

    def y(self, row: int) -> float:
        return self.height - self.bottom - row * self.dy

    @property
    def centre(self) -> float:
        return (self.left + self.mlp_x) / 2

    def node(self, name: str) -> tuple[float, float, float]:
        """(x centre, y centre, width) of a node by its MIB name."""
        match = _NODE.fullmatch(name)
        if match is None:
            raise ValueError(f"{name!r} is not a node of MIB's graph")
        if name == "input":
            return self.centre, self.y(0), self.head_w * 2
        if name == "logits":
            return self.centre, self.y(2 * self.n_layers + 1), self.head_w * 2
        if match[3] is not None:
            return self.mlp_x, self.y(2 * int(match[3]) + 2), self.head_w * 2
        layer, head = int(match[1]), int(match[2])
        return self.left + head * self.dx, self.y(2 * layer + 1), self.head_w


def _split(edge: str) -> tuple[str, str, str]:
    """ "a0.h1->a3.h2<q>" -> ("a0.h1", "a3.h2", "q"); the role is "" for an MLP or the logits."""
    sender, receiver = edge.split("->")
    if receiver.endswith(">") and receiver[-3] == "<":
        return sender, receiver[:-3], receiver[-2]
    return sender, receiver, ""


def edge_path(layout: _Layout, edge: str) -> str:
    """The path data of an edge: from the sender's top to the receiver's bottom (at its q, k or v point)."""
    sender, receiver, role = _split(edge)
    sx, sy, _ = layout.node(sender)
    rx, ry, width = layout.node(receiver)
    rx += _ATTACH.get(role, 0.0) * width
    sy -= 3.0
    ry += 3.0
    bend = max((sy - ry) / 2, layout.dy / 2)
    return f"M{sx:.1f},{sy:.1f} C{sx:.1f},{sy - bend:.1f} {rx:.1f},{ry + bend:.1f} {rx:.1f},{ry:.1f}"


def circuit_svg(
    edges: Sequence[tuple[str, float]], n_layers: int, n_heads: int, title: str, subtitle: str = ""
) -> str:
    """The circuit of `edges` ((MIB edge name, score) pairs) drawn on the graph of the model, as an SVG file;
    `title` and `subtitle` are its two heading lines."""
    layout = _Layout(n_layers, n_heads)
    top = max((abs(score) for _, score in edges), default=0.0) or 1.0
    touched: dict[str, int] = {}
    for edge, _ in edges:
        sender, receiver, _role = _split(edge)
        for node in (sender, receiver):
            touched[node] = touched.get(node, 0) + 1
    w, h = layout.width, layout.height
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg{_SVG_NS} class="circuit" viewBox="0 0 {w:.0f} {h:.0f}" width="{w:.0f}" height="{h:.0f}" '
        'font-family="sans-serif">',
        f"<title>{_esc(title)}{'; ' if subtitle else ''}{_esc(subtitle)}</title>",
        f'<rect x="0" y="0" width="{w:.0f}" height="{h:.0f}" fill="#ffffff"/>',
        f'<text x="8" y="14" font-size="10" font-weight="600">{_esc(title)}</text>',
        f'<text x="8" y="27" font-size="9">{_esc(subtitle)}</text>',
    ]
    parts += _legend(layout)
    parts += _nodes(layout, touched)
    parts.append('<g fill="none" stroke-opacity="0.5" stroke-linecap="round">')
    for edge, score in sorted(edges, key=lambda item: abs(item[1])):
        role = _split(edge)[2]
        dash = f' stroke-dasharray="{DASHES[role]}"' if DASHES.get(role) else ""
        colour = POSITIVE if score >= 0 else NEGATIVE
        parts.append(
            f'<path class="edge" d="{edge_path(layout, edge)}" stroke="{colour}" '
            f'stroke-width="{0.4 + 3.1 * abs(score) / top:.2f}"{dash}>'
            f"<title>{_esc(edge)}: score {score:+.4g}</title></path>"
        )
    parts += ["</g>", "</svg>", ""]
    return "\n".join(parts)


def _legend(layout: _Layout) -> list[str]:
    y = 40.0
    items = [(8.0, POSITIVE, "", "positive score"), (118.0, NEGATIVE, "", "negative score")]
    items += [(228.0 + 52 * i, "#333333", DASHES[role], f"<{role}>") for i, role in enumerate("qkv")]
    parts = []
    for x, colour, dash, label in items:
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<line x1="{x:.0f}" y1="{y:.0f}" x2="{x + 22:.0f}" y2="{y:.0f}" stroke="{colour}" '
                     f'stroke-width="2"{dashed}/>')  # fmt: skip
        parts.append(f'<text x="{x + 26:.0f}" y="{y + 3:.0f}" font-size="9">{_esc(label)}</text>')
    note = "input at the bottom, logits at the top; per layer its heads, then its MLP (right) above them; width grows "
    parts.append(f'<text x="8" y="{y + 16:.0f}" font-size="9" fill="#555555">{note}with |score|</text>')
    return parts


def _nodes(layout: _Layout, touched: dict[str, int]) -> list[str]:
    names = ["input", "logits"]
    for layer in range(layout.n_layers):
        names += [f"a{layer}.h{head}" for head in range(layout.n_heads)] + [f"m{layer}"]
    parts = ['<g class="nodes">']
    step = max(1, round(12 / layout.dy))  # layer labels no closer than 12 px
    for layer in range(0, layout.n_layers, step):
        parts.append(f'<text x="6" y="{layout.y(2 * layer + 1) + 3:.1f}" font-size="8" fill="#555555">'
                     f"layer {layer}</text>")  # fmt: skip
    labelled = len(touched) <= LABELLED_MAX
    for name in names:
        x, y, width = layout.node(name)
        kept = name in touched
        if name in ("input", "logits"):  # the two ends of every path: named whether or not an edge touches them
            parts.append(f'<text class="end-label" x="{x + width / 2 + 4:.1f}" y="{y + 3:.1f}" font-size="8" '
                         f'font-weight="600" fill="#1a1a1a">{name}</text>')  # fmt: skip
        elif kept and labelled:
            parts.append(f'<text x="{x + width / 2 + 2:.1f}" y="{y - 3:.1f}" font-size="7" fill="#1a1a1a">'
                         f"{_esc(name)}</text>")  # fmt: skip
        fill = "#1a1a1a" if kept else "#e4e4e4"
        tip = f"{name}: {touched[name]} drawn edges" if kept else f"{name}: not in the drawn circuit"
        kind = "node kept" if kept else "node"
        parts.append(f'<rect class="{kind}" x="{x - width / 2:.1f}" y="{y - 3:.1f}" width="{width:.1f}" height="6" '
                     f'rx="1.5" fill="{fill}"><title>{_esc(tip)}</title></rect>')  # fmt: skip
    parts.append("</g>")
    return parts


def inline_svg(text: str) -> str:
    """An SVG file's markup for inside an HTML page: no XML declaration and no namespace URL (HTML gives inline
    <svg> its namespace), so the page names no address."""
    body = text[text.index("<svg") :]
    return body.replace(_SVG_NS, "", 1)
