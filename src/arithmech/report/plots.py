"""Figures. matplotlib is imported inside each function, so importing arithmech stays light."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from arithmech.report.style import FILE_PARAMS, styled
from arithmech.runs import atomic_open


def save_figure(fig: Any, path: str | Path, **savefig_kwargs: Any) -> None:
    """Write a figure atomically in the format its suffix names (png, svg, pdf), then close it.

    A .png path also gets the same figure as .svg beside it (for papers), drawn with the arithmech style's
    file settings (report/style.py: text kept as text, fixed ids); each file is written atomically.
    """
    import matplotlib
    import matplotlib.pyplot as plt

    path = Path(path)
    targets = [path, path.with_suffix(".svg")] if path.suffix.lower() == ".png" else [path]
    try:
        for target in targets:
            fmt = target.suffix.lstrip(".").lower() or "png"
            kwargs = {"metadata": {"Date": None}, **savefig_kwargs} if fmt == "svg" else savefig_kwargs
            with matplotlib.rc_context(FILE_PARAMS), atomic_open(target, "wb") as handle:
                fig.savefig(handle, format=fmt, **kwargs)
    finally:
        plt.close(fig)


@styled
def effect_heatmap(
    head_effects: np.ndarray, mlp_effects: np.ndarray, path: Path, title: str, annotate_top: int = 8
) -> None:
    """Layers x heads heatmap and an MLP column, red negative / blue positive (paper Figure 2).

    head_effects: [layer, head], mlp_effects: [layer]; values are relative changes (-0.05 = -5%). Heads and
    MLPs get their own symmetric colour scales (MLP effects are often much larger), and the most negative
    cells are labelled with their value in percent.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    n_layers, n_heads = head_effects.shape
    fig_w = max(5.0, 0.42 * n_heads + 3.6)
    fig_h = max(3.2, 0.21 * n_layers + 1.6)
    # one grid row: heads, their colour bar, MLPs, theirs; thin bars of equal width and the panels' full height
    fig, (ax_heads, bar_heads, ax_mlp, bar_mlp) = plt.subplots(
        1, 4, figsize=(fig_w, fig_h), dpi=150, gridspec_kw={"width_ratios": [n_heads, 0.3, 1.6, 0.3]}
    )
    panels = (
        (ax_heads, bar_heads, head_effects * 100, "heads"),
        (ax_mlp, bar_mlp, mlp_effects[:, None] * 100, "MLP"),
    )
    for ax, bar, grid, label in panels:
        limit = float(np.nanmax(np.abs(grid))) or 1.0
        image = ax.imshow(grid, cmap="RdBu", norm=TwoSlopeNorm(0.0, -limit, limit), aspect="auto")
        for index in np.argsort(grid, axis=None)[:annotate_top]:
            row, col = divmod(int(index), grid.shape[1])
            if grid[row, col] < 0:
                ax.text(col, row, f"{grid[row, col]:.1f}", ha="center", va="center", fontsize=5, color="white")
        fig.colorbar(image, cax=bar, label=f"{label}: effect on answer logit (%)")
    ax_mlp.set_yticks(range(n_layers), [""] * n_layers)
    ax_heads.set_xticks(range(n_heads), [str(h) for h in range(n_heads)], fontsize=7)
    ax_heads.set_yticks(range(n_layers), [str(layer) for layer in range(n_layers)], fontsize=6)
    ax_heads.set_xlabel("head")
    ax_heads.set_ylabel("layer")
    ax_mlp.set_xticks([0], ["MLP"], fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


@styled
def knockout_curves(curves: list[tuple[str, list[dict[str, Any]], float, float]], path: Path, title: str) -> None:
    """Accuracy and answer probability after knocking out k components: effect-rank vs random-rank (Figure 3).

    curves: one (label, summary rows, baseline accuracy, baseline probability) per prompt set, the first drawn
    solid (held out) and the others dashed and lighter (in sample); label "" for a figure of one set. Summary
    rows: k, effect_accuracy, random_accuracy_mean/std, effect_prob, random_prob_mean/std.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.2), dpi=150)
    for ax, metric, label in ((axes[0], "accuracy", "accuracy"), (axes[1], "prob", "mean answer probability")):
        ticks: set[int] = {0}
        for number, (name, summary, base_accuracy, base_prob) in enumerate(curves):
            base = base_accuracy if metric == "accuracy" else base_prob
            ks = [row["k"] for row in summary]
            ticks |= set(ks)
            effect = [row[f"effect_{metric}"] for row in summary]
            mean = np.array([row[f"random_{metric}_mean"] for row in summary])
            std = np.array([row[f"random_{metric}_std"] for row in summary])
            line, alpha = ("-", 1.0) if number == 0 else ("--", 0.6)
            suffix = f", {name}" if name else ""
            ax.plot([0, *ks], [base, *effect], marker="o", color="#D55E00", linestyle=line, alpha=alpha,
                    label=f"effect-rank{suffix}")  # fmt: skip
            ax.plot([0, *ks], [base, *mean], marker="s", color="#0072B2", linestyle=line, alpha=alpha,
                    label=f"random-rank (mean){suffix}")  # fmt: skip
            ax.fill_between(ks, mean - std, mean + std, color="#0072B2", alpha=0.2 * alpha, linewidth=0,
                            label=f"random ± 1 sd{suffix}" if number == 0 else None)  # fmt: skip
        ax.set_xscale("symlog", base=2, linthresh=1)
        ax.set_xticks(sorted(ticks), [str(k) for k in sorted(ticks)])
        ax.set_xlabel("components knocked out (k)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6 if len(curves) > 1 else 7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
