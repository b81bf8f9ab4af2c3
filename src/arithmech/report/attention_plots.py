"""Attention-role figures: mass per token role for each head (paper Figure 5) and single prompts (Figure 7).

matplotlib is imported inside each function, so importing arithmech stays light. Colours are the Okabe-Ito
palette, which stays distinguishable under the common colour-vision deficiencies.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arithmech.report.plots import save_figure
from arithmech.report.style import styled

ROLE_COLOURS: dict[str, str] = {
    "A": "#D55E00",  # vermillion
    "B": "#E69F00",  # orange
    "operator": "#009E73",  # bluish green
    "prefix": "#56B4E9",  # sky blue
    "other": "#BBBBBB",  # grey
}


@styled
def role_bar_chart(
    heads: Sequence[str],
    scores: np.ndarray,
    roles: Sequence[str],
    labels: Sequence[str],
    path: Path,
    title: str,
    tau: float,
) -> None:
    """One horizontal stacked bar per head: the share of END's attention on each token role (Figure 5).

    scores: [head, role], each row summing to ~1; labels: "operand" / "operator" / "neither" per head.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(heads)
    fig, ax = plt.subplots(figsize=(8.0, max(2.2, 0.42 * n + 1.3)), dpi=150)
    y = np.arange(n)
    left = np.zeros(n)
    for j, role in enumerate(roles):
        values = scores[:, j]
        ax.barh(y, values, left=left, color=ROLE_COLOURS.get(role, "#777777"), label=role, edgecolor="white")
        for i, value in enumerate(values):
            if value >= 0.08:
                ax.text(left[i] + value / 2, i, f"{value:.2f}", ha="center", va="center", fontsize=6)
        left += values
    ax.set_yticks(y, [f"{h}  ({label})" for h, label in zip(heads, labels, strict=True)], fontsize=7)
    ax.invert_yaxis()  # first head on top
    ax.set_xlim(0, 1)
    ax.set_xlabel("mean attention from END (share of the row)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="token role",
              title_fontsize=7)
    ax.set_title(f"{title}\noperand: A+B >= {tau:g} and > operator; operator: operator >= {tau:g} and > A+B",
                 fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


@styled
def attention_examples(
    examples: Sequence[dict[str, Any]],
    heads: Sequence[str],
    path: Path,
    title: str,
) -> None:
    """For each example prompt, a heads x tokens heatmap of END's attention, tokens on the axis (Figure 7).

    Each example is {"tokens": [str], "roles": [str], "weights": [[float] per head]} (weights [head, pos]).
    Tick labels are coloured by role (A, B, operator as in `role_bar_chart`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    longest = max(len(e["tokens"]) for e in examples)
    short = all(len(token) <= 2 for e in examples for token in e["tokens"])
    fig_w = min(24.0, max(6.0, 0.22 * longest + 2.0))
    fig_h = sum(0.3 * len(heads) + 1.1 for _ in examples) + 0.6
    fig, axes = plt.subplots(len(examples), 1, figsize=(fig_w, fig_h), dpi=150, squeeze=False)
    for number, (ax, example) in enumerate(zip(axes[:, 0], examples, strict=True)):
        weights = np.asarray(example["weights"], dtype=float)  # [head, pos]
        image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6),
                          aspect="auto", interpolation="nearest")
        ax.set_yticks(range(len(heads)), list(heads), fontsize=6)
        tokens = example["tokens"]
        ax.set_xticks(range(len(tokens)), tokens, fontsize=6, rotation=0 if short else 90)
        ax.set_ylabel(f"prompt {number}", fontsize=7)
        for tick, role in zip(ax.get_xticklabels(), example["roles"], strict=True):
            if role in ("A", "B", "operator"):
                tick.set_color(ROLE_COLOURS[role])
                tick.set_fontweight("bold")
        fig.colorbar(image, ax=ax, shrink=0.9, pad=0.01, label="attention")
    axes[0, 0].set_title(title, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
