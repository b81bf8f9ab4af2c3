"""Faithfulness curves: f of the top-k % circuit against the share of edges kept, one curve per method.

Two panels: edges ranked by signed score (its area is CPR) and by |score| (the area of |1 - f| is CMD), x on a
log scale (MIB's sizes run from 0.1 % to 100 %), with f = 1 (the full model) and f = 0 (everything ablated) as
reference lines. matplotlib is imported inside the function, so importing arithmech stays light.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from arithmech.report.plots import save_figure
from arithmech.report.style import styled


@styled
def faithfulness_curves(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]], path: Path, title: str
) -> None:
    """curves: method -> (percents, f with signed ranking, f with absolute ranking)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6), dpi=150, sharey=True)
    for ax, (index, name) in zip(axes, ((1, "signed score (CPR: area under f)"), (2, "|score| (CMD: area of |1 - f|)")),
                                 strict=True):  # fmt: skip
        for method, values in curves.items():
            ax.plot(values[0], values[index], marker="o", markersize=3, label=method)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.axhline(0.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.set_xlabel("edges kept (%)")
        ax.set_title(f"ranked by {name}", fontsize=8)
    axes[0].set_ylabel("faithfulness f")
    axes[1].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path, bbox_inches="tight")
