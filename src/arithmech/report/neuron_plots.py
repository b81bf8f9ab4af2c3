"""Figures of the neurons stage: head importance per operation, and pruning curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from arithmech.report.plots import save_figure
from arithmech.report.style import styled


@styled
def importance_heatmaps(importance: Any, dims: dict[str, Any], path: Path, title: str) -> None:
    """One layer x head panel per operation: drop of P(original top token) with the head zeroed.

    Heads that were not scored are blank; all panels share one colour scale so operations compare directly.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers, n_heads = int(dims["n_layers"]), int(dims["n_heads"])
    ops = list(importance.operations)
    grids = np.full((len(ops), n_layers, n_heads), np.nan)
    for j, c in enumerate(importance.components):
        if c.head is not None:
            grids[:, c.layer, c.head] = importance.prob_drop[:, j].numpy()
    top = float(np.nanmax(np.abs(grids))) if np.isfinite(grids).any() else 1.0
    fig, axes = plt.subplots(1, len(ops), figsize=(2.2 + 0.32 * n_heads * len(ops), 0.18 * n_layers + 1.6),
                             squeeze=False)  # fmt: skip
    image = None
    for ax, op, grid in zip(axes[0], ops, grids, strict=True):
        image = ax.imshow(grid, aspect="auto", cmap="cividis", vmin=0, vmax=top, origin="upper")
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("head")
        ax.set_xticks(range(n_heads))
        ax.tick_params(labelsize=6)
    axes[0][0].set_ylabel("layer")
    if image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="drop in P(top token)")
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path, dpi=130, bbox_inches="tight")


@styled
def pruning_curves(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Accuracy with only the top-scored neurons kept vs the same number of random ones (mean +- sd)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(str(r.get("prompts", "")), []).append(r)
    for label, group in groups.items():
        kept = np.array([max(r["n_kept"], 1) for r in group], dtype=float)
        suffix = f" ({label} prompts)" if label else ""
        top_fmt, random_fmt = ("o:", "s:") if label == "ranking" and len(groups) > 1 else ("o-", "s--")
        ax.plot(kept, [r["top_accuracy"] for r in group], top_fmt, color="#0072B2",
                label=f"top-scored neurons kept{suffix}")  # fmt: skip
        mean = np.array([r["random_accuracy_mean"] for r in group], dtype=float)
        sd = np.nan_to_num(np.array([r["random_accuracy_sd"] for r in group], dtype=float))
        ax.errorbar(kept, mean, yerr=sd, fmt=random_fmt, color="#E69F00", capsize=3,
                    label=f"random neurons kept{suffix}")  # fmt: skip
    if rows:
        ax.axhline(rows[0]["baseline_accuracy"], color="grey", linestyle="-.", label="nothing pruned")
    ax.set_xscale("log")
    ax.set_xlabel("neurons kept in the pruned layers")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=8)
    save_figure(fig, path, dpi=130, bbox_inches="tight")
