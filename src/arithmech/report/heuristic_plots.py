"""Figures of the heuristics stage: template families per layer, operand-grid thumbnails, ablation curves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arithmech.report.plots import save_figure
from arithmech.report.style import styled

_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999", "#882255")


def _by_operation(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row["operation"]), []).append(row)
    return groups


@styled
def heuristic_types(rows: Sequence[dict[str, Any]], families: Sequence[str], path: Path, title: str) -> None:
    """Per operation and layer, three bars: the share of the layer's neurons classified per operand template
    family (left, stacked), the share classified by both families (middle, grey: they are in the bars beside it
    too) and per result template family (right, stacked); a black tick on each bar marks its null (the same rule
    on activations permuted over the pairs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    groups = _by_operation(rows)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.4 * len(groups) + 1.6, 3.2), squeeze=False, sharey=True)
    for ax, (op, group) in zip(axes[0], groups.items(), strict=True):
        layers = np.array([int(r["layer"]) for r in group])
        n = np.array([float(r["neurons"]) for r in group])
        for side, (kind, shift) in enumerate((("operand", -0.28), ("result", 0.28))):
            bottom = np.zeros(len(layers))
            for family, colour in zip(families, _COLOURS, strict=False):
                if family.startswith("result") != (kind == "result"):
                    continue
                share = np.array([float(r[f"family_{family}"]) for r in group])
                ax.bar(layers + shift, share, bottom=bottom, color=colour, width=0.27, label=family.replace("_", " "))
                bottom += share
            null = [float(r[f"{kind}_null_fraction"]) for r in group]
            ax.scatter(layers + shift, null, color="black", marker="_", s=30, zorder=3,
                       label="null (permuted activations)" if side == 0 else None)  # fmt: skip
        both = np.array([float(r["overlap_both"]) for r in group]) / n
        ax.bar(layers, both, color="#555555", width=0.27, hatch="//", edgecolor="white", linewidth=0,
               label="operand & result templates (in the side bars too)")  # fmt: skip
        ax.scatter(layers, [float(r["overlap_both_null_fraction"]) for r in group], color="black", marker="_", s=30,
                   zorder=3)  # fmt: skip
        ax.set_title(f"{op}: operand | operand & result | result", fontsize=9)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("share of the layer's neurons classified")
    axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path, dpi=130, bbox_inches="tight")


@styled
def activation_patterns(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """One A x B image per strongest neuron (rows: operations), its activation at each answered pair; pairs
    outside the grid or not answered are blank. Red positive, blue negative, one scale per image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _by_operation(rows)
    n_cols = max([len({r["rank"] for r in g}) for g in groups.values()] + [1])
    fig, axes = plt.subplots(len(groups) or 1, n_cols, figsize=(1.9 * n_cols + 0.4, 2.1 * max(len(groups), 1)),
                             squeeze=False)  # fmt: skip
    for ax in axes.flat:
        ax.axis("off")
    for row_axes, (op, group) in zip(axes, groups.items(), strict=False):
        size = max(max(int(r["a"]), int(r["b"])) for r in group) + 1
        for col, rank in enumerate(sorted({int(r["rank"]) for r in group})):
            cells = [r for r in group if int(r["rank"]) == rank]
            image = np.full((size, size), np.nan)
            for r in cells:
                image[int(r["a"]), int(r["b"])] = float(r["activation"])
            top = float(np.nanmax(np.abs(image))) or 1.0
            ax = row_axes[col]
            ax.axis("on")
            ax.imshow(image, cmap="RdBu_r", vmin=-top, vmax=top, origin="upper", interpolation="nearest")
            first = cells[0]
            kind = max(("operand", "result"), key=lambda g, r=first: (int(r[f"{g}_classified"]),
                                                                      float(r[f"{g}_score"])))  # fmt: skip
            mark = "" if int(first[f"{kind}_classified"]) else " (unclassified)"
            ax.set_title(f"{op[:3]} L{first['layer']}.{first['neuron']}\n{first[f'{kind}_template']}{mark} "
                         f"{float(first[f'{kind}_score']):.2f}", fontsize=6)  # fmt: skip
            ax.set_xlabel("B", fontsize=6)
            ax.set_ylabel("A", fontsize=6)
            ax.tick_params(labelsize=5)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


@styled
def ablation_curves(rows: Sequence[dict[str, Any]], one_percent: int, path: Path, title: str) -> None:
    """Per operation: accuracy after ablating k neurons per layer, top by direct effect vs random (mean +- sd
    over seeds), mean and zero ablation; the dotted line marks k = 1% of a layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _by_operation(rows)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.3 * len(groups) + 0.6, 3.2), squeeze=False, sharey=True)
    styles = {("top", "mean"): ("#D55E00", "-", "o"), ("top", "zero"): ("#D55E00", "--", "^"),
              ("random", "mean"): ("#0072B2", "-", "s"), ("random", "zero"): ("#0072B2", "--", "v")}  # fmt: skip
    for ax, (op, group) in zip(axes[0], groups.items(), strict=True):
        base = next(float(r["accuracy"]) for r in group if r["selection"] == "none")
        for (selection, ablation), (colour, line, marker) in styles.items():
            cells = [r for r in group if r["selection"] == selection and r["ablation"] == ablation]
            if not cells:
                continue
            ks = sorted({int(r["k"]) for r in cells})
            acc = [[float(r["accuracy"]) for r in cells if int(r["k"]) == k] for k in ks]
            mean, sd = np.array([np.mean(a) for a in acc]), np.array([np.std(a) for a in acc])
            ax.plot([0, *ks], [base, *mean], color=colour, linestyle=line, marker=marker, markersize=3,
                    label=f"top by DE, {ablation}" if selection == "top" else f"random, {ablation}")  # fmt: skip
            if selection == "random":
                ax.fill_between(ks, mean - sd, mean + sd, color=colour, alpha=0.12, linewidth=0)
        ax.axvline(one_percent, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{op} ({group[0]['prompts']} prompts)", fontsize=9)
        ax.set_xlabel("neurons ablated per layer (k)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title + f"; dotted: 1% of a layer (k={one_percent})", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)
