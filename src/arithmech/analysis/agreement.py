"""How well two patching methods agree: rank correlation and overlap of their top components.

Background
    A fast approximation (attribution patching, `patching/attribution.py`) is only useful if it ranks
    components as the exact method (`patching/path.py`) does. Syed et al. (2023) and Kramar et al. (2024)
    judge attribution patching by its rank agreement with activation patching; METHODS.md sec. 2 asks to
    report the rank correlation with the exact effects.

Formulas, for effects x, y of the same n components:
    spearman(x, y)         = Pearson correlation of rank(x) and rank(y), ties given their average rank
                             (as scipy.stats.spearmanr); nan when either input is constant.
    top_k_overlap(a, b, k) = |top_k(a) & top_k(b)| / k, top = most negative effect (the components whose
                             counterfactual output lowers the answer logit most). Among equal effects at
                             the cut, the earlier component (in `all_components` order) is taken.

Usage
    >>> compare_methods(path_patch(view, batch), attribution_patch(view, batch))
    {'spearman_all': 0.9, 'spearman_heads': 0.88, 'spearman_mlps': 0.95, 'top5_overlap': 0.8, ...}

References: Syed, Rager & Conmy 2023 (arXiv:2310.10348); Kramar et al. 2024, AtP* (arXiv:2403.00745);
METHODS.md sec. 2.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from arithmech.errors import ConfigError
from arithmech.patching.path import PatchResult

ArrayLike = torch.Tensor | np.ndarray | Sequence[float]


def _as_vector(values: ArrayLike) -> np.ndarray:
    """[n] float64 numpy vector from a tensor, array or sequence."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)


def average_ranks(values: ArrayLike) -> np.ndarray:
    """[n] ranks 1..n of `values`, ascending; tied values share the mean of the ranks they span."""
    x = _as_vector(values)
    if len(x) == 0:
        return x
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    new_run = np.r_[True, sorted_x[1:] != sorted_x[:-1]]  # [n] True where a run of equal values starts
    starts = np.flatnonzero(new_run)  # [runs] first sorted index of each run
    ends = np.r_[starts[1:], len(x)]  # [runs] one past its last
    mean_rank = (starts + ends + 1) / 2.0  # [runs] mean of the ranks starts+1 .. ends
    run = np.cumsum(new_run) - 1  # [n] run of each sorted element
    ranks = np.empty(len(x))
    ranks[order] = mean_rank[run]
    return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman rank correlation of two equal-length vectors (ties: average ranks); nan if one is constant."""
    a, b = _as_vector(x), _as_vector(y)
    if len(a) != len(b):
        raise ConfigError(f"cannot correlate {len(a)} values with {len(b)}; pass effects of the same components")
    if len(a) < 2:
        raise ConfigError(f"a rank correlation needs at least 2 values, got {len(a)}")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(np.sqrt((ra**2).sum() * (rb**2).sum()))
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


def top_k(effects: ArrayLike, k: int) -> list[int]:
    """Indices of the k most negative effects, most negative first; ties broken by index."""
    x = _as_vector(effects)
    if not 1 <= k <= len(x):
        if k > len(x):
            raise ConfigError(f"k={k} is larger than the {len(x)} components")
        raise ConfigError(f"k={k} must be at least 1")
    return [int(i) for i in np.argsort(x, kind="stable")[:k]]


def top_k_overlap(a_effects: ArrayLike, b_effects: ArrayLike, k: int) -> float:
    """Share of the k most negative components of `a` that are also among the k most negative of `b`."""
    a, b = _as_vector(a_effects), _as_vector(b_effects)
    if len(a) != len(b):
        raise ConfigError(f"cannot compare {len(a)} effects with {len(b)}; pass effects of the same components")
    return len(set(top_k(a, k)) & set(top_k(b, k))) / k


def compare_methods(exact: PatchResult, approx: PatchResult, ks: Sequence[int] = (5, 10, 20)) -> dict[str, float]:
    """Agreement of an approximate scan with the exact one on the same components and prompts.

    Keys: spearman_all, spearman_heads, spearman_mlps (nan where a group has fewer than 2 components),
    top{k}_overlap for each k in `ks` that is at most the number of components (larger ones are left out).
    """
    if exact.components != approx.components:
        raise ConfigError("the two results cover different components; run both scans on the same model")
    if exact.per_prompt.shape != approx.per_prompt.shape:
        raise ConfigError(
            f"the two results have {exact.per_prompt.shape[1]} and {approx.per_prompt.shape[1]} prompts; "
            "run both scans on the same prompts"
        )
    x, y = exact.effects, approx.effects  # [component]
    is_head = torch.tensor([c.head is not None for c in exact.components])
    out = {"spearman_all": spearman(x, y)}
    for name, mask in (("heads", is_head), ("mlps", ~is_head)):
        out[f"spearman_{name}"] = spearman(x[mask], y[mask]) if int(mask.sum()) >= 2 else float("nan")
    for k in ks:
        if k <= len(x):
            out[f"top{k}_overlap"] = top_k_overlap(x, y, k)
    return out


def agreement_table(importance: dict[str, ArrayLike], ks: Sequence[int] = (5, 10, 20)) -> list[dict[str, float | str]]:
    """Pairwise agreement of several methods scoring the same sites, higher = more important.

    One row per pair of methods (in the order given): method_a, method_b, spearman, and top{k}_overlap for each
    k up to the number of sites. Scores may hold NaN only where a method does not score that site at all; such
    sites are left out of that pair's comparison (n_sites says how many remain).
    """
    names = list(importance)
    vectors = {name: _as_vector(importance[name]) for name in names}
    lengths = {len(v) for v in vectors.values()}
    if len(lengths) > 1:
        raise ConfigError(f"the methods score different numbers of sites ({sorted(lengths)}); score the same sites")
    rows: list[dict[str, float | str]] = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            keep = ~(np.isnan(vectors[a]) | np.isnan(vectors[b]))
            x, y = vectors[a][keep], vectors[b][keep]
            row: dict[str, float | str] = {"method_a": a, "method_b": b, "n_sites": float(keep.sum())}
            row["spearman"] = spearman(x, y) if len(x) >= 2 else float("nan")
            for k in ks:
                row[f"top{k}_overlap"] = top_k_overlap(-x, -y, k) if k <= len(x) else float("nan")
            rows.append(row)
    return rows
