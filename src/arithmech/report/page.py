"""The report page: sections of figures, tables and readings, rendered as one self-contained HTML file.

Self-contained means the file opens anywhere with nothing else: figures are embedded as base64 PNG `data:`
URLs, the CSS is inline, there is no script, font or stylesheet from elsewhere. Every text that comes from a
run folder is escaped (and non-printable characters, which tokens often are, are shown as \\xNN escapes).
Numbers print the same way everywhere: shares as percentages, effects as signed percentages. A section whose
numbers rest on fewer than SMALL_SAMPLE prompts or pairs says so in a warning above its figures, and its
title and contents entry carry a "small sample" badge.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard


@dataclass(frozen=True)
class Figure:
    """A PNG written by a stage, shown with what it shows; its .svg twin is linked when present."""

    path: Path
    caption: str


@dataclass(frozen=True)
class Drawing:
    """An SVG written by arithmech itself (circuit.svg), shown inline so that its <title> tooltips work on hover
    (`read_drawing` makes one)."""

    path: Path
    caption: str
    markup: str
    """The <svg> element, checked to hold no script, event handler or address."""


@dataclass(frozen=True)
class Table:
    """Rows of already formatted cells; `collapsed` tables sit in a <details> block (long, secondary)."""

    caption: str
    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    collapsed: bool = False


@dataclass(frozen=True)
class Body:
    """What a section builder reads from a finished stage folder."""

    reading: str
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    small: list[str] = field(default_factory=list)
    """The sample sizes below SMALL_SAMPLE behind its numbers, as phrases (`small_samples`)."""
    drawings: list[Drawing] = field(default_factory=list)


@dataclass(frozen=True)
class Section:
    stage: str
    title: str
    status: str
    """"done", "not run", "did not finish", "stale" or "could not be read"."""
    body: Body | None = None
    folder: Path | None = None
    note: str = ""


# --- how numbers print -------------------------------------------------------------------------------------


def is_number(value: float | None) -> TypeGuard[float]:
    """A finite number (not None, NaN or infinite)."""
    return value is not None and math.isfinite(value)


def pct(value: float | None, digits: int = 0) -> str:
    """0.47 -> "47%"; NaN or None -> "n/a"; never "-0%"."""
    if not is_number(value):
        return "n/a"
    text = f"{value * 100:.{digits}f}"
    return (text.lstrip("-") if float(text) == 0 else text) + "%"


def signed_pct(value: float | None, digits: int = 1) -> str:
    """-0.014 -> "-1.4%"."""
    return f"{value * 100:+.{digits}f}%" if is_number(value) else "n/a"


def num(value: float | None, digits: int = 3) -> str:
    """A plain number with `digits` significant digits; n/a when missing."""
    if not is_number(value):
        return "n/a"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"


def fixed(value: float | None, digits: int = 2) -> str:
    """A correlation or share with a fixed number of decimals: 1.0 -> "1.00"."""
    return f"{value:.{digits}f}" if is_number(value) else "n/a"


def count(value: float | None) -> str:
    """A count with thousands separators: 144064 -> "144,064"."""
    return f"{int(value):,}" if is_number(value) else "n/a"


def to_float(text: str | None) -> float:
    """A CSV cell as a float; empty or missing -> NaN."""
    return math.nan if text is None or text == "" else float(text)


def listing(items: Sequence[str], limit: int = 8) -> str:
    """Items as prose ("a, b and c"); a longer list ends with "and N more"."""
    items = list(items)
    if not items:
        return "none"
    if len(items) > limit:
        return ", ".join(items[:limit]) + f" and {len(items) - limit} more"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


SMALL_SAMPLE = 10
"""Numbers from fewer prompts or pairs than this carry a small-sample warning: means, medians and rankings of a
handful of prompts change from one sample to the next (a median indirect effect of 2 pairs can be 1e6)."""


def small_samples(sizes: Mapping[str, object], unit: str) -> list[str]:
    """Phrases for the sizes below SMALL_SAMPLE: {"addition": 2, "factual": 2} -> ["2 pairs for addition and
    factual"] (unit "pair"); the name "" stands for the whole section ("4 prompts"). Missing sizes and 0 (no
    number is reported then) are left out."""
    groups: dict[int, list[str]] = {}
    for name, size in sizes.items():
        try:
            n = float(size)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if is_number(n) and 0 < n < SMALL_SAMPLE:
            groups.setdefault(int(n), []).append(name)
    phrases = []
    for n, names in sorted(groups.items()):
        named = [name for name in names if name]
        phrases.append(f"{n} {unit if n == 1 else unit + 's'}" + (f" for {listing(named)}" if named else ""))
    return phrases


# --- HTML ---------------------------------------------------------------------------------------------------


def clean(text: object) -> str:
    """Escaped for HTML, with non-printable characters shown as \\xNN (tokens can be control bytes)."""
    raw = "".join(ch if ch.isprintable() or ch in "\n" else f"\\x{ord(ch):02x}" for ch in str(text))
    return html.escape(raw)


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: #1a1a1a; background: #fff; margin: 0; line-height: 1.5; }
main { max-width: 1100px; margin: 0 auto; padding: 1.5rem 1.25rem 3rem; }
h1 { font-size: 1.6rem; margin: 0 0 .5rem; } h2 { font-size: 1.25rem; margin: 0 0 .5rem; }
section { border-top: 1px solid #ccc; padding-top: 1.25rem; margin-top: 1.75rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .85rem; }
th, td { border: 1px solid #ccc; padding: .2rem .55rem; text-align: left; vertical-align: top; }
th { background: #f2f2f2; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
caption { caption-side: top; text-align: left; font-weight: 600; padding-bottom: .25rem; }
figure { margin: 1rem 0; } img.plot { max-width: 100%; height: auto; border: 1px solid #e5e5e5; }
.drawing svg { max-width: 100%; height: auto; border: 1px solid #e5e5e5; }
figcaption { font-size: .85rem; color: #444; }
.status { display: inline-block; font-size: .75rem; font-weight: 600; padding: .05rem .45rem; border-radius: .6rem;
          border: 1px solid; vertical-align: middle; margin-left: .4rem; }
.done { color: #005a8c; border-color: #0072B2; } .missing { color: #555; border-color: #999; }
.unfinished { color: #8f3e00; border-color: #D55E00; }
.small { color: #8f3e00; border-color: #E69F00; }
.caveat { background: #fff6e0; border-left: 4px solid #E69F00; padding: .5rem .8rem; }
.reading { background: #f7f7f7; border-left: 4px solid #0072B2; padding: .5rem .8rem; }
.banner { background: #fff4e5; border-left: 4px solid #D55E00; padding: .5rem .8rem; font-weight: 600; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .1rem 1rem; font-size: .9rem; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; word-break: break-all; }
footer { border-top: 1px solid #ccc; margin-top: 2rem; padding-top: 1rem; font-size: .85rem; }
code { font-size: .85em; }
"""

_STATUS_CLASS = {"done": "done", "not run": "missing"}
_NUMERIC = re.compile(r"^([+-]?\d[\d,]*(\.\d+)?(e[+-]?\d+)?%?( ± .*)?|n/a)$")
"""Cells right-aligned as numbers: 12, -1.4%, 0.91 ± 0.05, 1,234, 3e-05, n/a."""


def status_badge(status: str) -> str:
    return f'<span class="status {_STATUS_CLASS.get(status, "unfinished")}">{clean(status)}</span>'


def badges(section: Section) -> str:
    """The status badge, and a "small sample" badge when the section's numbers rest on few prompts or pairs."""
    small = section.body is not None and section.body.small
    return status_badge(section.status) + ('<span class="status small">small sample</span>' if small else "")


def small_sample_html(small: Sequence[str]) -> str:
    text = (f"The figures and numbers of this section rest on {listing(small)}, fewer than {SMALL_SAMPLE}: another "
            "sample can change them a lot. Rerun with more prompts or pairs before relying on them.")  # fmt: skip
    return f'<p class="caveat"><strong>Small sample.</strong> {clean(text)}</p>'


def table_html(table: Table) -> str:
    head = "".join(f"<th>{clean(h)}</th>" for h in table.header)
    body = []
    for row in table.rows:
        cells = []
        for cell in row:
            numeric = _NUMERIC.match(cell) is not None
            cells.append(f'<td class="n">{clean(cell)}</td>' if numeric else f"<td>{clean(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    inner = f"<table><caption>{clean(table.caption)}</caption><thead><tr>{head}</tr></thead>"
    inner += "<tbody>" + "".join(body) + "</tbody></table>"
    if table.collapsed:
        return f"<details><summary>{clean(table.caption)}</summary>{inner}</details>"
    return inner


def figure_html(figure: Figure, stage: str, out_dir: Path) -> str:
    """The PNG inline as base64, with links to the PNG and SVG files relative to the report."""
    data = base64.b64encode(figure.path.read_bytes()).decode("ascii")
    ident = f"fig-{stage}-{figure.path.stem}"
    links = []
    for twin in (figure.path, figure.path.with_suffix(".svg")):
        if twin.is_file():
            href = Path(os.path.relpath(twin.resolve(), out_dir.resolve())).as_posix()
            links.append(f'<a href="{clean(href)}">{twin.suffix.lstrip(".").upper()}</a>')
    files = f" Files: {' · '.join(links)}." if links else ""
    return (
        f'<figure id="{ident}"><img class="plot" id="{ident}-img" src="data:image/png;base64,{data}" '
        f'alt="{clean(figure.caption)}"><figcaption>{clean(figure.caption)}{files}</figcaption></figure>'
    )


_UNSAFE_SVG = re.compile(r"<script|<foreignObject|\bon[a-z]+\s*=|://|href", re.IGNORECASE)


def read_drawing(path: Path, caption: str) -> Drawing:
    """An SVG file for inline display: its namespace URL dropped (HTML gives inline <svg> its own). ValueError
    for markup that could run or fetch anything, so the page stays a document without script or address."""
    from arithmech.report.circuit_drawing import inline_svg

    markup = inline_svg(path.read_text())
    if _UNSAFE_SVG.search(markup):
        raise ValueError(f"{path.name} holds a script, an event handler or a link, so it is not arithmech's drawing")
    return Drawing(path, caption, markup)


def drawing_html(drawing: Drawing, stage: str, out_dir: Path) -> str:
    """The SVG inline, with a link to its file relative to the report."""
    href = Path(os.path.relpath(drawing.path.resolve(), out_dir.resolve())).as_posix()
    return (
        f'<figure id="drawing-{stage}-{drawing.path.stem}"><div class="drawing">{drawing.markup}</div>'
        f'<figcaption>{clean(drawing.caption)} File: <a href="{clean(href)}">SVG</a>.</figcaption></figure>'
    )


def section_html(section: Section, out_dir: Path) -> str:
    parts = [f'<section id="{section.stage}"><h2>{clean(section.title)}{badges(section)}</h2>']
    if section.body is None:
        message = {
            "not run": "This stage was not run for this run folder.",
            "did not finish": "This stage's folder has no metadata.json: the stage did not finish, so its "
            "files are not shown (rerun the same command to complete it).",
        }.get(section.status, "")
        parts.append(f"<p>{clean(message)}</p>" if message else f'<p class="banner">{clean(section.note)}</p>')
    else:
        if section.folder is not None:
            rel = Path(os.path.relpath(section.folder.resolve(), out_dir.resolve())).as_posix()
            parts.append(f"<p>Folder: <code>{clean(rel)}</code></p>")
        if section.body.small:
            parts.append(small_sample_html(section.body.small))
        parts.append(f'<p class="reading">{clean(section.body.reading)}</p>')
        parts.extend(figure_html(figure, section.stage, out_dir) for figure in section.body.figures)
        parts.extend(drawing_html(drawing, section.stage, out_dir) for drawing in section.body.drawings)
        parts.extend(table_html(table) for table in section.body.tables)
    parts.append("</section>")
    return "\n".join(parts)


def render_page(
    title: str, meta: Sequence[tuple[str, str]], sections: Sequence[Section], footer: Table, out_dir: Path
) -> str:
    """The whole HTML document: header with run facts, table of contents, sections, timings footer."""
    facts = "".join(f"<dt>{clean(k)}</dt><dd>{clean(v)}</dd>" for k, v in meta)
    toc = "".join(f'<li><a href="#{s.stage}">{clean(s.title)}</a>{badges(s)}</li>' for s in sections)
    body = "\n".join(section_html(s, out_dir) for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{clean(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        f'<header><h1>{clean(title)}</h1><dl class="meta">{facts}</dl></header>\n'
        f"<nav><h2>Contents</h2><ol>{toc}</ol></nav>\n{body}\n"
        f"<footer><h2>Stage timings</h2>{table_html(footer)}</footer>\n</main>\n</body>\n</html>\n"
    )
