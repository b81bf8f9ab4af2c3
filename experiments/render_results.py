"""docs/results.md and the README's findings, rendered from the committed files under results/.

Every number those pages give is a placeholder in a template (results/pages/*.md.j2, Jinja) filled from the
study folders that experiments/results.py keeps, the way benchmarks/readme_tables.py renders the performance
tables from benchmarks/results.json. tests/unit/test_results_pages.py fails when a page differs from what its
template renders (a hand edit) and when a template's prose holds a measured-looking number typed by hand (a
decimal or a percentage outside a placeholder, a code span or a code block).

    python experiments/render_results.py            # print the pages
    python experiments/render_results.py --write    # rewrite docs/results.md and README.md's demo and findings
    python experiments/render_results.py --check    # exit 1 when a page differs from what results/ renders

In a template, `results.<study>.<run>.<file>` is a file a study kept: a CSV as a `Table` of rows (numbers parsed),
a JSON file as its value; `results.<study>.study` is its study.json. Folder and file names are written with `_`
for `-`. `published` is results/published.json: numbers quoted from papers, with their sources.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
TEMPLATES = RESULTS / "pages"


@dataclass(frozen=True)
class Page:
    """A rendered page: its template, and the marker lines it is written between (None: the whole file)."""

    path: Path
    template: str
    markers: tuple[str, str] | None = None


PAGES = (
    Page(ROOT / "docs" / "results.md", "results.md.j2"),
    Page(ROOT / "README.md", "demo.md.j2", ("<!-- demo:begin -->", "<!-- demo:end -->")),
    Page(ROOT / "README.md", "findings.md.j2", ("<!-- findings:begin -->", "<!-- findings:end -->")),
)


class Row:
    """One CSV row; columns read as attributes (`row.cpr`) or items (`row["cpr"]`)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __getitem__(self, key: str) -> Any:
        return self.__dict__[key]

    def __repr__(self) -> str:
        return f"Row({self.__dict__})"


class Table(list[Row]):
    """The rows of a kept CSV file, with the few selections templates need."""

    def where(self, **equal: Any) -> Table:
        """The rows whose columns equal the given values."""
        return Table(r for r in self if all(getattr(r, k) == v for k, v in equal.items()))

    def above(self, column: str, value: float) -> Table:
        """The rows whose `column` is above `value`."""
        return Table(r for r in self if getattr(r, column) > value)

    def starting(self, column: str, prefix: str) -> Table:
        """The rows whose `column` starts with `prefix`."""
        return Table(r for r in self if str(getattr(r, column)).startswith(prefix))

    def one(self, **equal: Any) -> Row:
        """The one row whose columns equal the given values (an error for none or several)."""
        rows = self.where(**equal)
        if len(rows) != 1:
            raise KeyError(f"{len(rows)} rows match {equal}, not one")
        return rows[0]

    def best(self, column: str, **equal: Any) -> Row:
        """The row of largest `column` among those whose columns equal the given values (empty cells skipped)."""
        rows = [r for r in self.where(**equal) if getattr(r, column) is not None]
        if not rows:
            raise KeyError(f"no row with {column} matches {equal}")
        return max(rows, key=lambda r: getattr(r, column))

    def col(self, name: str) -> list[Any]:
        return [getattr(r, name) for r in self]

    def total(self, column: str) -> float:
        return sum(getattr(r, column) for r in self)

    def mean(self, column: str) -> float | None:
        """The mean of a column's non-empty cells (None for none)."""
        values = [getattr(r, column) for r in self if getattr(r, column) is not None]
        return sum(values) / len(values) if values else None

    def sum_by(self, key: str, value: str) -> dict[Any, float]:
        """`value` summed over the rows of each `key`, in the order keys first appear."""
        sums: dict[Any, float] = {}
        for row in self:
            sums[getattr(row, key)] = sums.get(getattr(row, key), 0.0) + getattr(row, value)
        return sums

    def gap(self, key: str, a: str, b: str) -> dict[Any, float]:
        """Column `a` minus column `b` for each row's `key`."""
        return {getattr(r, key): getattr(r, a) - getattr(r, b) for r in self}

    def top(self, column: str, n: int, absolute: bool = False, reverse: bool = True) -> Table:
        """The n rows of largest `column` (of smallest with reverse=False; by magnitude with absolute)."""
        def key(row: Row) -> float:
            value = getattr(row, column)
            return abs(value) if absolute else value

        return Table(sorted(self, key=key, reverse=reverse)[:n])


INTEGER = re.compile(r"[-+]?\d+")
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|nan)")


def _value(text: str) -> Any:
    """A CSV cell as int, float, bool or text ("" as None)."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    if NUMBER.fullmatch(text):
        return int(text) if INTEGER.fullmatch(text) else float(text)
    return text


TEXT_COLUMNS = frozenset({"component", "components", "head", "neuron", "edge", "seeds", "token", "template_id",
                          "high_frequencies", "removed_frequencies"})  # fmt: skip
"""Columns kept as text: a head named 20.10 is not the number 20.1."""


def read_table(path: Path) -> Table:
    with path.open(newline="") as handle:
        rows = csv.DictReader(handle)
        return Table(Row({k: v if k in TEXT_COLUMNS else _value(v) for k, v in row.items()}) for row in rows)


class Folder:
    """A results/ folder: its files and subfolders as attributes (`-` read as `_`)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        for candidate in (name, name.replace("_", "-")):
            folder = self._path / candidate
            if folder.is_dir():
                return Folder(folder)
            for suffix, read in ((".csv", read_table), (".json", _read_json)):
                if (self._path / f"{candidate}{suffix}").is_file():
                    return read(self._path / f"{candidate}{suffix}")
        raise AttributeError(f"{self._path.relative_to(self._path.parents[1])} has no file or folder {name!r}")

    __getitem__ = __getattr__

    def __contains__(self, name: str) -> bool:
        """`"arithmetic-sft" in results`: whether a study (file or folder) has been kept yet."""
        return any((self._path / f"{name}{suffix}").exists() for suffix in ("", ".csv", ".json"))


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


# Filters: how numbers are written on the pages.


def pct(value: float | None, digits: int = 1) -> str:
    """0.071 -> "7.1%" (an empty cell: "-")."""
    if value is None:
        return "-"
    return f"{100 * value:.{digits}f}%"


def num(value: float | None, digits: int = 2) -> str:
    """A number with `digits` decimals; integers with thousands separators (an empty cell: "-")."""
    if value is None:
        return "-"
    if isinstance(value, int) or digits == 0 or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def size(percent: float) -> str:
    """A circuit size in % of edges as the sweep names it: 0.1, 2, 50."""
    return f"{percent:g} %"


def signed(value: float, digits: int = 1) -> str:
    """+9.1 / -8.2."""
    return f"{value:+.{digits}f}"


def minutes(seconds: float) -> str:
    """Wall time in whole minutes, or seconds below two minutes."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def largest(values: dict[Any, float], n: int) -> list[Any]:
    """The n keys of largest value, largest first."""
    return sorted(values, key=lambda key: values[key], reverse=True)[:n]


def area(curve: Table, lo: float = 0.0, hi: float = 100.0) -> float:
    """Trapezoid area of f over x = percent / 100 between the sweep sizes lo and hi % (CPR's rule over the whole
    sweep, circuits/faithfulness.py), on a curve's rows in increasing percent; the empty circuit's 0 % row, where
    a curve has one, is not a sweep size."""
    points = [(r.percent / 100, r.f) for r in curve if lo <= r.percent <= hi and r.percent > 0]
    return sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False))


def reaching(curve: Table, level: float) -> Row | None:
    """The smallest swept circuit whose f is at least `level` (None: none)."""
    return next((r for r in curve if r.f >= level), None)


def median(values: list[float]) -> float:
    return statistics.median(values)


def spans(numbers: list[int]) -> str:
    """[20, 21, 22, 24] -> "20-22, 24"."""
    out: list[tuple[int, int]] = []
    for n in sorted(numbers):
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


FILTERS: dict[str, Callable[..., Any]] = {
    "pct": pct, "num": num, "size": size, "signed": signed, "minutes": minutes, "largest": largest, "spans": spans,
    "median": median, "area": area, "reaching": reaching,
}  # fmt: skip


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(FILTERS)
    env.globals.update(isnan=math.isnan)
    return env


def render(page: Page, results: Path = RESULTS) -> str:
    """The page's rendered text (between its markers, without them)."""
    published = _read_json(results / "published.json") if (results / "published.json").is_file() else {}
    text = environment().get_template(page.template).render(results=Folder(results), published=published)
    return text if page.markers is None else text.strip("\n") + "\n"


def current(page: Page) -> str:
    """What the page holds now (between its markers)."""
    text = page.path.read_text()
    if page.markers is None:
        return text
    begin, end = page.markers
    if begin not in text or end not in text:
        raise SystemExit(f"{page.path} lacks the marker lines {begin} / {end}")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def write(page: Page, rendered: str) -> None:
    if page.markers is None:
        page.path.write_text(rendered)
        return
    text = page.path.read_text()
    begin, end = page.markers
    head, rest = text.split(begin, 1)
    page.path.write_text(f"{head}{begin}\n{rendered.strip(chr(10))}\n{end}{rest.split(end, 1)[1]}")


TYPED_NUMBER = re.compile(r"(?<![\w.\-/#])\d+(?:\.\d+)?\s?%|(?<![\w.\-/#])\d+\.\d+(?![\w.])")
"""A percentage or a decimal in prose: what a measured result looks like when typed by hand."""


def typed_numbers(template: str) -> Iterator[str]:
    """Measured-looking numbers in a template's literal prose (outside Jinja tags, code spans and code blocks)."""
    prose = re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", " ", template, flags=re.S)
    prose = re.sub(r"^```.*?^```", " ", prose, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", " ", prose)
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
    for match in TYPED_NUMBER.finditer(prose):
        yield match.group(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the pages")
    mode.add_argument("--check", action="store_true", help="exit 1 when a page differs from results/")
    args = parser.parse_args()
    stale = []
    for page in PAGES:
        rendered = render(page)
        if args.write:
            write(page, rendered)
        elif args.check:
            if current(page) != rendered:
                stale.append(str(page.path.relative_to(ROOT)))
        else:
            print(rendered)
    if stale:
        print(f"{', '.join(stale)} differ from results/: python experiments/render_results.py --write", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
