"""Figures of the Fourier analysis (Zhou et al. 2024): the frequency x layer spectra of attention and MLP
outputs, and the accuracy after each filter. matplotlib is imported inside each function, so importing arithmech
stays light. Colours are Okabe-Ito (colour-blind safe); the two filters also differ by line style."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arithmech.report.plots import save_figure
from arithmech.report.style import styled

_COLOURS = {"attention": "#0072B2", "mlp": "#D55E00"}
_STYLES = {"low-pass": ("-", "o"), "high-pass": ("--", "s")}
_NAMES = {"attention": "attention", "mlp": "MLP"}


@styled
def spectrum_heatmaps(
    magnitude: Mapping[str, np.ndarray], layers: Sequence[int], n_numbers: int, path: Path, title: str
) -> None:
    """One panel per component kind: layer (rows) x frequency (columns) of the mean |DFT| of the number logits.

    magnitude maps "attention" and "mlp" to [layer, F + 1] arrays aligned with `layers`. Each panel has its own
    colour scale (attention and MLP outputs differ in size); frequency 0, a shift of every number's logit, is
    drawn but left out of the scale so that it cannot wash out the rest.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [kind for kind in ("attention", "mlp") if kind in magnitude]
    n_freq = next(iter(magnitude.values())).shape[1]
    panel = min(7.0, max(4.0, 0.3 * n_freq + 2.0))  # inches per panel: 10 numbers ~ 4, 100 or more numbers 7
    fig, axes = plt.subplots(1, len(kinds), figsize=(panel * len(kinds), max(3.2, 0.2 * len(layers) + 1.8)),
                             dpi=150, squeeze=False)  # fmt: skip
    for ax, kind in zip(axes[0], kinds, strict=True):
        grid = np.asarray(magnitude[kind], dtype=float)  # [layer, F + 1]
        top = float(grid[:, 1:].max()) if n_freq > 1 and grid[:, 1:].size else float(grid.max())
        image = ax.imshow(grid, cmap="magma", aspect="auto", vmin=0.0, vmax=top if top > 0 else None)
        step = max(1, n_freq // 12)
        ax.set_xticks(range(0, n_freq, step), [str(f) for f in range(0, n_freq, step)], fontsize=7)
        ystep = max(1, len(layers) // 16)
        ax.set_yticks(range(0, len(layers), ystep), [str(layers[i]) for i in range(0, len(layers), ystep)],
                      fontsize=6)  # fmt: skip
        ax.set_xlabel(f"frequency f (period {n_numbers}/f numbers)")
        ax.set_ylabel("layer")
        ax.set_title(f"{_NAMES[kind]} output", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8, label="mean |DFT| of the number logits")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


@styled
def filter_curves(rows: Sequence[Mapping[str, Any]], baseline: Mapping[str, float], path: Path, title: str) -> None:
    """Accuracy (left) and answer probability (right) against the cutoff, one line per (group, filter), with
    the unfiltered model as a grey line. rows: the fourier_filters.csv rows (component, filter, cutoff,
    accuracy, answer_prob)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10.0, 3.8), dpi=150, sharex=True)
    lines: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        lines.setdefault((str(row["component"]), str(row["filter"])), []).append(row)
    for ax, key, label in ((axes[0], "accuracy", "accuracy"), (axes[1], "answer_prob", "P(answer)")):
        for (group, kind), points in lines.items():
            points = sorted(points, key=lambda r: int(r["cutoff"]))
            style, marker = _STYLES.get(kind, ("-", "o"))
            ax.plot([int(r["cutoff"]) for r in points], [float(r[key]) for r in points], linestyle=style,
                    marker=marker, markersize=3, color=_COLOURS.get(group, "#555555"),
                    label=f"{_NAMES.get(group, group)}, {kind}")  # fmt: skip
        ax.axhline(float(baseline[key]), color="#777777", linewidth=0.8, label="no filter")
        ax.set_xlabel("cutoff frequency (low-pass keeps f <= cutoff, high-pass keeps f >= cutoff)", fontsize=7)
        ax.set_ylabel(label)
        if key == "accuracy":
            ax.set_ylim(-0.02, 1.02)
        else:  # probabilities of a weak model are small: keep them readable
            ax.set_ylim(bottom=0.0)
        ax.grid(alpha=0.25, linewidth=0.5)
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
