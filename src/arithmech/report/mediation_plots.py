"""Causal mediation heatmaps: indirect effect by layer (y) and position class (x), one column per task.

Stolfo et al. (2023, Figures 2-4) show the indirect effect (IE) of the MLPs and of attention at each layer and
token position. Placing arithmetic beside number retrieval and factual recall, on one colour scale, shows
whether the cells that carry the arithmetic result (typically late-layer MLPs at the last token) do the same
for the comparison tasks. Rows are components (MLP, attention), each with its own symmetric colour scale
shared by every task in the row, since MLP and attention effects can differ by orders of magnitude.

The scale is symmetric-logarithmic (linear within ±`linthresh`, default 0.01): IE is a ratio of
probabilities and has heavy tails. On SmolLM2-135M with 4 pairs per task, most cells lie within ±1 while a
few reach 1e3-1e5 (a base prompt giving r' a probability near 0 makes (P*(r') - P(r')) / P(r') explode, above
all for facts), so a linear scale shows one dark cell and white elsewhere.

The colour map is ColorBrewer's RdBu (reversed): diverging, safe under the common colour-vision deficiencies,
white at IE = 0, red where the intervention moves probability from r to r' (the component carries the
result), blue for the opposite. Grey cells have no value (a class absent from a task, e.g. operand2 in facts).
matplotlib is imported inside the function, so importing arithmech stays light.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from arithmech.data.mediation_tokens import POSITION_CLASSES
from arithmech.report.plots import save_figure
from arithmech.report.style import styled

COMPONENT_LABELS: dict[str, str] = {"mlp": "MLP", "attn": "attention"}


@styled
def mediation_heatmaps(
    tables: Mapping[str, np.ndarray],
    components: Sequence[str],
    layers: Sequence[int],
    path: str | Path,
    title: str,
    n_pairs: Mapping[str, int] | None = None,
    label: str = "indirect effect",
    classes: Sequence[str] = POSITION_CLASSES,
    linthresh: float = 0.01,
) -> None:
    """Write a grid of heatmaps: one row per component, one column per task (in the order of `tables`).

    tables: task -> IE [component, layer, class] (components and layers in the order given); NaN is drawn
    grey. n_pairs: task -> pairs behind the column, shown in its title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize, SymLogNorm

    tasks = list(tables)
    n_rows, n_cols = len(components), len(tasks)
    row_height = max(2.2, 0.13 * len(layers) + 1.2)
    fig, axes = plt.subplots(
        n_rows,
        n_cols,
        figsize=(1.4 + 2.2 * n_cols, 0.6 + row_height * n_rows),
        dpi=150,
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#d9d9d9")
    layer_step = max(1, len(layers) // 16)  # at most ~16 layer labels per axis
    for row, component in enumerate(components):
        grids = [np.asarray(tables[task], dtype=float)[row] for task in tasks]  # each [layer, class]
        finite = np.concatenate([grid[np.isfinite(grid)] for grid in grids])
        limit = float(np.abs(finite).max()) if finite.size else 0.0
        if limit > 10 * linthresh:  # heavy tails: log beyond ±linthresh
            norm: Normalize = SymLogNorm(linthresh, vmin=-limit, vmax=limit, base=10)
            scale = f" (log scale beyond ±{linthresh:g})"
        else:
            norm, scale = Normalize(-(limit or 1.0), limit or 1.0), ""  # an all-zero row still gets a scale
        image = None
        for col, (task, grid) in enumerate(zip(tasks, grids, strict=True)):
            ax = axes[row, col]
            image = ax.imshow(
                np.ma.masked_invalid(grid),
                cmap=cmap,
                norm=norm,
                aspect="auto",
                origin="lower",
                interpolation="nearest",
            )
            ax.set_xticks(range(len(classes)), list(classes), rotation=45, ha="right", fontsize=6)
            ticks = list(range(0, len(layers), layer_step))
            ax.set_yticks(ticks, [str(layers[i]) for i in ticks], fontsize=6)
            if row == 0:
                count = f" (n={n_pairs[task]})" if n_pairs and task in n_pairs else ""
                ax.set_title(f"{task}{count}", fontsize=8)
            if col == 0:
                ax.set_ylabel(f"{COMPONENT_LABELS.get(component, component)}: layer", fontsize=7)
        colorbar = fig.colorbar(image, ax=list(axes[row]), shrink=0.9)
        colorbar.set_label(label + scale, fontsize=7)
        colorbar.ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)
