"""Figures. matplotlib is imported inside each function, so importing arithmech stays light."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from arithmech.runs import atomic_open


def effect_heatmap(
    head_effects: np.ndarray, mlp_effects: np.ndarray, path: Path, title: str, annotate_top: int = 10
) -> None:
    """Layers x heads heatmap plus an MLP column, red negative / blue positive (paper Figure 2).

    head_effects: [layer, head], mlp_effects: [layer]; values are relative changes (-0.05 = -5%).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    n_layers, n_heads = head_effects.shape
    grid = np.concatenate([head_effects, mlp_effects[:, None]], axis=1) * 100  # percent
    limit = float(np.nanmax(np.abs(grid))) or 1.0
    fig_w = max(4.0, 0.45 * (n_heads + 1) + 2.0)
    fig_h = max(3.0, 0.22 * n_layers + 1.5)
    fig, ax = plt.subplots(figsize=(fig_w, fig_h), dpi=150)
    image = ax.imshow(grid, cmap="RdBu", norm=TwoSlopeNorm(0.0, -limit, limit), aspect="auto")
    ax.axvline(n_heads - 0.5, color="black", linewidth=1.0)
    ax.set_xticks(range(n_heads + 1), [str(h) for h in range(n_heads)] + ["MLP"], fontsize=7)
    ax.set_yticks(range(n_layers), [str(layer) for layer in range(n_layers)], fontsize=6)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    flat = np.argsort(grid, axis=None)[:annotate_top]
    for index in flat:
        layer, col = divmod(int(index), n_heads + 1)
        ax.text(col, layer, f"{grid[layer, col]:.0f}", ha="center", va="center", fontsize=5, color="white")
    fig.colorbar(image, ax=ax, label="effect on answer logit (%)", shrink=0.8)
    fig.tight_layout()
    path = Path(path)
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
