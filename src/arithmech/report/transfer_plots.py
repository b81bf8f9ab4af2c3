"""Transfer figure: accuracy drop when each source's key components are knocked out on each target set.

Two heatmaps one above the other (source x target, sharing the target axis, so many targets stay legible):
the effect-rank drop and the random-rank control's mean drop, on one colour scale, each cell annotated with its
value. matplotlib is imported inside the function, so importing arithmech stays light; the colour map is
cividis, which is readable under the common colour-vision deficiencies and in greyscale. Cells without prompts
(NaN) are grey and marked "n/a".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from arithmech.report.plots import save_figure
from arithmech.report.style import styled


@styled
def transfer_heatmap(
    sources: Sequence[str],
    targets: Sequence[str],
    effect_drop: Sequence[Sequence[float]],
    random_drop: Sequence[Sequence[float]],
    path: Path,
    title: str,
) -> None:
    """effect_drop, random_drop: [source, target] relative accuracy drops (0 = none kept, 1 = all lost)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("effect-rank knockout", np.asarray(effect_drop, dtype=float)),
              ("random-rank control (mean)", np.asarray(random_drop, dtype=float)))
    n_s, n_t = panels[0][1].shape
    cmap = plt.get_cmap("cividis").with_extremes(bad="#DDDDDD")
    fig, axes = plt.subplots(2, 1, figsize=(max(5.0, 0.75 * n_t + 3.5), 2 * (0.45 * n_s + 0.8) + 1.6), dpi=150,
                             sharex=True, squeeze=False)  # fmt: skip
    image = None
    for ax, (name, values) in zip(axes[:, 0], panels, strict=True):
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(n_t), list(targets), rotation=35, ha="right", fontsize=7)
        ax.set_yticks(range(n_s), list(sources), fontsize=7)
        ax.set_title(name, fontsize=8)
        for i in range(n_s):
            for j in range(n_t):
                value = values[i, j]
                text = "n/a" if np.isnan(value) else f"{value:.0%}"
                colour = "black" if np.isnan(value) or value > 0.55 else "white"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
    assert image is not None
    fig.colorbar(image, ax=list(axes[:, 0]), fraction=0.03, pad=0.02, label="accuracy drop (relative)")
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path, bbox_inches="tight")
