"""Figure of how far methods agree: a method x method matrix of Spearman correlations per level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from arithmech.report.plots import save_figure
from arithmech.report.style import styled


@styled
def agreement_matrices(rows: list[dict[str, Any]], methods: list[str], path: Path, title: str) -> None:
    """One panel per level (heads, layers): Spearman of each pair of methods, annotated with top-10 overlap.

    `rows` are agreement_table rows with a "level" key; a method without scores at a level is left blank.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [level for level in ("head", "layer") if any(r["level"] == level for r in rows)]
    fig, axes = plt.subplots(1, max(len(levels), 1), figsize=(4.6 * max(len(levels), 1), 4.2), squeeze=False)
    image = None
    for ax, level in zip(axes[0], levels, strict=False):
        n = len(methods)
        rho = np.full((n, n), np.nan)
        label = np.full((n, n), "", dtype=object)
        for i in range(n):
            rho[i, i] = 1.0
        for row in (r for r in rows if r["level"] == level):
            i, j = methods.index(row["method_a"]), methods.index(row["method_b"])
            rho[i, j] = rho[j, i] = row["spearman"]
            overlap = row.get("top10_overlap", float("nan"))
            text = f"{row['spearman']:.2f}" + ("" if np.isnan(overlap) else f"\n{overlap:.0%}")
            label[i, j] = label[j, i] = text
        scored = [i for i in range(n) if not np.isnan(np.delete(rho[i], i)).all()]
        for i in range(n):
            if i not in scored:
                rho[i, i] = np.nan
        image = ax.imshow(rho, cmap="PuOr", vmin=-1, vmax=1)
        for i in range(n):
            for j in range(n):
                if label[i, j]:
                    ax.text(j, i, label[i, j], ha="center", va="center", fontsize=8)
        ax.set_xticks(range(n), methods, rotation=30, ha="right")
        ax.set_yticks(range(n), methods)
        ax.set_title(f"{level}s: Spearman (top-10 overlap)")
    if image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="Spearman correlation")
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path, dpi=130, bbox_inches="tight")
