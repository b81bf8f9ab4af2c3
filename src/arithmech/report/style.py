"""One figure style for every arithmech figure: colour-blind-safe colours, small readable type, paper-ready files.

Colours
    Lines and categories use the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal Design"), whose eight
    colours stay distinguishable under protanopia, deuteranopia and tritanopia; blue comes first and black
    last, so a figure with one line draws it blue. Maps use perceptually uniform colour maps that are safe
    under colour-vision deficiencies: `SEQUENTIAL` (cividis, readable in greyscale too) for magnitudes,
    viridis where finer contrast helps, and a diverging map with white at zero for signed values:
    `DIVERGING` (PuOr) for correlations, and ColorBrewer's RdBu for path-patching and mediation effects,
    which ColorBrewer also marks as colour-blind safe and which keeps the paper's red-negative /
    blue-positive reading of Figure 2.

Files
    Text in SVG stays text (`svg.fonttype: none`), so a figure can be edited and searched in a paper; PDF
    embeds TrueType fonts (`pdf.fonttype: 42`); SVG element ids come from a fixed salt, so the same figure
    gives the same file.

Usage
    Decorate a figure function with `@styled`; its figures are drawn inside `figure_style()`, a
    `matplotlib.rc_context`, so the style never leaks into the caller's matplotlib settings:

    >>> @styled
    ... def my_figure(values, path): ...

matplotlib is imported only when a styled function runs, so importing arithmech stays light.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

OKABE_ITO: dict[str, str] = {
    "blue": "#0072B2",
    "orange": "#E69F00",
    "bluish green": "#009E73",
    "vermillion": "#D55E00",
    "sky blue": "#56B4E9",
    "reddish purple": "#CC79A7",
    "yellow": "#F0E442",
    "black": "#000000",
}
"""The Okabe-Ito palette, in the order lines take it."""

SEQUENTIAL = "cividis"
"""Default colour map for magnitudes (perceptually uniform, colour-blind safe, greyscale-readable)."""

DIVERGING = "PuOr"
"""Diverging map for signed values such as correlations (white at zero, colour-blind safe)."""

RC_PARAMS: dict[str, Any] = {
    "axes.prop_cycle": None,  # filled with OKABE_ITO when matplotlib is imported (needs its cycler)
    "image.cmap": SEQUENTIAL,
    "font.size": 8.0,
    "axes.titlesize": 9.0,
    "axes.labelsize": 8.0,
    "xtick.labelsize": 7.0,
    "ytick.labelsize": 7.0,
    "legend.fontsize": 7.0,
    "figure.titlesize": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.8,
    "lines.linewidth": 1.5,
    "lines.markersize": 4.0,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
}
"""The drawing rcParams of the style."""

FILE_PARAMS: dict[str, Any] = {"svg.fonttype": "none", "svg.hashsalt": "arithmech", "pdf.fonttype": 42}
"""rcParams for writing files; `report.plots.save_figure` applies them to every figure it writes."""

P = ParamSpec("P")
R = TypeVar("R")


def style_params() -> dict[str, Any]:
    """RC_PARAMS and FILE_PARAMS with the Okabe-Ito colour cycle filled in; imports matplotlib."""
    from matplotlib import cycler

    return {**RC_PARAMS, **FILE_PARAMS, "axes.prop_cycle": cycler(color=list(OKABE_ITO.values()))}


@contextmanager
def figure_style() -> Iterator[None]:
    """Draw inside this block with the arithmech style; every setting is restored on exit."""
    import matplotlib

    matplotlib.use("Agg")
    with matplotlib.rc_context(style_params()):
        yield


def styled(function: Callable[P, R]) -> Callable[P, R]:
    """Run a figure function inside `figure_style()`."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with figure_style():
            return function(*args, **kwargs)

    return wrapper
