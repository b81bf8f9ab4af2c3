"""Figures of the MLP logit lens (Zhang et al. 2024, Figure 6). matplotlib is imported inside each function,
so importing arithmech stays light. Colours are Okabe-Ito (colour-blind safe); correct and wrong candidates
also differ by line style, so the figures read in greyscale too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from arithmech.report.plots import save_figure
from arithmech.report.style import styled

_BLUE, _ORANGE, _GREEN, _VERMILLION = "#0072B2", "#E69F00", "#009E73", "#D55E00"


@styled
def mlp_cosine_curves(
    layers: Sequence[int],
    mean: Mapping[str, np.ndarray],
    sem: Mapping[str, np.ndarray],
    path: Path,
    title: str,
) -> None:
    """Two panels over layers (paper Figure 6a, 6b), mean over prompts with a +-1 standard-error band.

    Left: cos(MLP_in, W_U[A]) and cos(MLP_in, W_U[B]) (solid) against the mean over wrong candidate
    numbers (dashed). Right: cos(MLP_out - MLP_in, W_U[C]) against wrong candidates. mean and sem map the
    names of `logit_lens.COSINE_COLUMNS` to [layer] arrays aligned with `layers`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.asarray(layers)
    fig, (ax_in, ax_up) = plt.subplots(1, 2, figsize=(10.0, 3.8), dpi=150, sharex=True)
    panels = (
        (ax_in, [("cos_in_A", "A", _BLUE, "o"), ("cos_in_B", "B", _ORANGE, "s")],
         "(a) MLP input", "cos(MLP_in, W_U[token])"),
        (ax_up, [("cos_update_C", "C (answer)", _GREEN, "o")],
         "(b) MLP update", "cos(MLP_out - MLP_in, W_U[token])"),
    )  # fmt: skip
    for ax, lines, panel_title, ylabel in panels:
        for name, label, colour, marker in lines:
            wrong_colour = colour if name != "cos_update_C" else _VERMILLION
            for key, style, text, col in (
                (name, "-", label, colour),
                (f"{name}_wrong", "--", f"other numbers (vs {label.split()[0]})", wrong_colour),
            ):
                y, err = np.asarray(mean[key]), np.asarray(sem[key])
                ax.plot(x, y, linestyle=style, marker=marker, markersize=3, color=col, label=text)
                ax.fill_between(x, y - err, y + err, color=col, alpha=0.15, linewidth=0)
        ax.axhline(0.0, color="#555555", linewidth=0.6)
        ax.set_title(panel_title, fontsize=9)
        ax.set_xlabel("layer")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.legend(fontsize=7, frameon=False)
        ax.grid(alpha=0.25, linewidth=0.5)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def _rank_text(rank: int) -> str:
    if rank < 1000:
        return str(rank)
    return f"{rank // 1000}k"


@styled
def update_rank_heatmap(
    ranks: np.ndarray,
    layers: Sequence[int],
    labels: Sequence[str],
    path: Path,
    title: str,
    highlight: Mapping[str, int] | None = None,
) -> None:
    """Layer x number-token heatmap of each number's rank in the logits of the MLP update (Figure 6c).

    ranks: [layer, n_numbers] (0 = top of the vocabulary), rows aligned with `layers`, columns with `labels`.
    Colour is log10(rank + 1), bright = near the top; each cell shows its rank. `highlight` maps a
    role name ("A", "B", "C") to a column, which is marked in the column labels.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers, n_numbers = ranks.shape
    grid = np.log10(ranks.astype(float) + 1.0)
    fig_w = max(4.5, 0.45 * n_numbers + 2.4)
    fig_h = max(3.0, 0.22 * n_layers + 1.6)
    fig, ax = plt.subplots(figsize=(fig_w, fig_h), dpi=150)
    image = ax.imshow(grid, cmap="viridis_r", aspect="auto", vmin=0.0)
    if n_numbers <= 40:
        threshold = grid.max() / 2 if grid.size else 0.0
        for row in range(n_layers):
            for col in range(n_numbers):
                colour = "white" if grid[row, col] > threshold else "black"
                ax.text(col, row, _rank_text(int(ranks[row, col])), ha="center", va="center",
                        fontsize=5, color=colour)  # fmt: skip
    roles_by_col: dict[int, list[str]] = {}
    for role, col in (highlight or {}).items():
        roles_by_col.setdefault(col, []).append(role)
    ticks = [
        f"{label}\n({'/'.join(roles_by_col[i])})" if i in roles_by_col else label
        for i, label in enumerate(labels)
    ]
    ax.set_xticks(range(n_numbers), ticks, fontsize=7)
    ax.set_yticks(range(n_layers), [str(layer) for layer in layers], fontsize=6)
    ax.set_xlabel("number token")
    ax.set_ylabel("layer")
    fig.colorbar(image, ax=ax, shrink=0.8, label="log10(rank + 1) in the vocabulary")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
