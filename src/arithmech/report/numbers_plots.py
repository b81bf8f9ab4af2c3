"""Figures of the numbers stage (Kantamneni & Tegmark 2025): LD restored per layer by reading, and the operands
on the best helix's first circle beside its shuffled control. matplotlib is imported inside each function."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from arithmech.report.plots import save_figure
from arithmech.report.style import styled

_COLOURS = {"layer": "#000000", "helix": "#D55E00", "circle": "#E69F00", "circles": "#E69F00", "linear": "#0072B2",
            "log": "#56B4E9", "pca": "#777777", "poly": "#CC79A7", "digit-circles": "#009E73",
            "digit-linear": "#117733"}  # fmt: skip


def _best_per_kind(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """kind -> the family of that kind with the most LD summed over layers (one line per kind)."""
    total: dict[str, float] = {}
    kind_of: dict[str, str] = {}
    for r in rows:
        if r["ld"] is None:
            continue
        total[r["family"]] = total.get(r["family"], 0.0) + float(r["ld"])
        kind_of[r["family"]] = str(r["kind"])
    best: dict[str, str] = {}
    for family, value in total.items():
        kind = kind_of[family]
        if kind not in best or value > total[best[kind]]:
            best[kind] = family
    return best


@styled
def ld_by_family(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    """One panel per site: LD against layer for the whole layer and the best family of each kind, the best
    helix's shuffled control dashed and the corrupted run's LD as a grey line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sites = list(dict.fromkeys(str(r["site"]) for r in rows))
    cols = min(3, len(sites))
    n_rows = (len(sites) + cols - 1) // cols
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.4 * cols, 3.2 * n_rows), dpi=150, squeeze=False)
    for ax, site in zip(axes.flat, sites, strict=False):
        mine = [r for r in rows if r["site"] == site]
        for kind, family in _best_per_kind(mine).items():
            points = sorted((r for r in mine if r["family"] == family), key=lambda r: int(r["layer"]))
            ax.plot([int(r["layer"]) for r in points], [float(r["ld"]) for r in points], marker="o", markersize=2.5,
                    linewidth=1.6 if kind in ("layer", "helix") else 1.0, color=_COLOURS.get(kind, "#555555"),
                    label=family)  # fmt: skip
            if kind == "helix":
                ax.plot([int(r["layer"]) for r in points], [float(r["ld_shuffled"]) for r in points], linestyle="--",
                        color=_COLOURS["helix"], linewidth=1.0, label=f"{family}, shuffled a")  # fmt: skip
        if mine and mine[0]["ld_corrupted"] is not None:
            ax.axhline(float(mine[0]["ld_corrupted"]), color="#BBBBBB", linewidth=0.8, label="corrupted run")
        ax.set_title(site + (" (control: a's fit at b's token)" if mine and mine[0]["control"] else ""), fontsize=8)
        ax.set_xlabel("layer (residual entering it)")
        ax.set_ylabel("logit difference")
        ax.grid(alpha=0.25, linewidth=0.5)
        ax.legend(fontsize=6, frameon=False)
    for ax in list(axes.flat)[len(sites) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


@styled
def helix_projection(panels: Sequence[tuple[str, Sequence[tuple[int, float, float]]]], path: Path, title: str) -> None:
    """Side-by-side scatter plots of (value, x, y) points coloured by the value: the fit and its shuffled
    control."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), dpi=150, squeeze=False)
    for ax, (label, points) in zip(axes[0], panels, strict=True):
        values = [p[0] for p in points]
        image = ax.scatter([p[1] for p in points], [p[2] for p in points], c=values, cmap="viridis", s=14)
        for v, x, y in points:
            if len(points) <= 30 or v % 10 == 0:
                ax.annotate(str(v), (x, y), fontsize=5, alpha=0.7)
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("cos coordinate")
        ax.set_ylabel("sin coordinate")
        fig.colorbar(image, ax=ax, shrink=0.8, label="operand")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
