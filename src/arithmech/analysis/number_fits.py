"""How a layer represents the numbers it reads: rival readings fitted to the activations, each giving a
subspace and a reconstruction that the numbers stage patches (Kantamneni & Tegmark 2025).

Background
    Kantamneni & Tegmark (ICML 2025, arXiv 2502.00873, sec. 4) read the residual stream at the last token of
    an operand a over a = 0..99 and find a generalized helix: B(a) = [a, cos(2 pi a / T), sin(2 pi a / T) for T
    in {2, 5, 10, 100}]. They judge a fit not by R^2 but by how much of the logit difference its
    reconstruction restores when patched into a run whose operand was changed (the numbers stage does that;
    this module only fits). Rival readings: a linear value (Zhu et al. 2025), a log-compressed line (AlQuabeh
    et al. 2025), per-digit circles mod 10 (Levy & Geva 2025, for tokenizers that split numbers into digits).

Fit, per site (a token position and the operand whose value v varies) and layer
    M[v]  [value, d_model]: the mean activation over the prompts whose operand is v (train values only: the
          80 % of the values kept for fitting, `heldout_split`);
    mu    [d_model] = mean over train values of M[v];  X = M - mu  [train, d_model]
    P     [d_model, k]: the top k principal directions of X (k = pca_dim, K&T's 100);  Z = X P  [train, k]
    B     [value, m]: the family's basis at every value (`basis`), Bbar its mean over train values;
    C     [m, k] = argmin |Z - (B - Bbar) C|^2 (least squares on the train values);
    W     [d_model, m] = P C^T: the fit's image in the residual stream; Q [d_model, r] an orthonormal basis of
          its columns (r <= m; directions below `_RANK_TOL` of the largest dropped);
    r(v)  [d_model] = mu + W (B[v] - Bbar): the fit's reconstruction of any value (in-sample on train values).
    f(v)  [d_model]: the fit's *prediction* of v, the value the stage patches: for a held-out value r(v) (the fit
          never saw it); for a train value the leave-one-out prediction mu + P z_loo(v), z_loo(v) = Z_v - E_v /
          (1 - h_v), with E = Z - H Z the residuals and h_v the leverage (diagonal of the hat matrix H of [1, B -
          Bbar] on the train values): exactly what the same least squares fitted without v predicts for v (a
          value of leverage 1, which the others cannot predict, gets the mean of the others). An in-sample
          r(v) would carry about m / n_train of v's own activation whatever the basis (the hat matrix's
          diagonal), so a fit of any m columns, a shuffled one too, would restore that share by leakage alone.
    PCA of dimension m (the equal-size baseline): Q = P[:, :m], f(v) = r(v) = mu + Q Q^T (M[v] - mu): the
    projection of v's own mean activation, not a prediction (PCA predicts nothing for a value it did not see:
    its held-out LD is a projection too, and is marked so in the table).
    The stage patches h' = h + Q Q^T (f(v) - h): the clean value's predicted activation inside the fit's
    subspace, the corrupted run's own activation h everywhere else. Kantamneni & Tegmark (sec. 4.2) patch the
    fit's prediction for the clean operand, C B(a) taken back to the residual basis with the mean added, not
    the clean activation's projection (the paper's text was not at hand to quote whether they keep the rest
    from the corrupted run; we do, as issue 35 asks). Its chance level is the same fit's patch of another value
    u, h + Q Q^T (f(u) - h): it erases the corrupted value in Q as the fit's own patch does (erasing alone moves
    LD about half-way to the clean run's, so a share measured from the corrupted run credits any fit with about
    one half); the stage measures every fit from it.

Shuffled control (the order control)
    The same family fitted with its basis rows permuted over the train values (one seeded permutation pi per
    family): C_s = argmin |Z - (B[pi] - Bbar) C|^2, and the clean value v is predicted (leave-one-out) from
    B[pi(v)]. In sample, a fit of any m features captures some m-dimensional slice of the variation, ordered or
    not (PCA even makes phantom oscillations from smooth data, so R^2 alone cannot tell); its out-of-sample
    prediction, measured from its patch of another value, restores nothing in expectation. A held-out value
    keeps B[v] (pi permutes train values only).

Families (`families`), each at a stated dimension m
    linear [v];  log [log(1 + v)];  circle-T [cos, sin of 2 pi v / T] (period 2: cos only, since sin(pi v) = 0 on
    integers: K&T's 9-dimensional helix has 8 columns that are not zero);  circles [cos, sin for every period, no
    linear term: K&T's "circle"];  helix-T1-T2.. [v and the circles of a subset of the periods]: every
    non-empty subset, up to 4 periods, of {2, 5, 10, 100} restricted to the periods the range can show (T <=
    the number of values in the range: a whole period);  when the tokenizer splits numbers into digits,
    digit-circles [cos, sin of 2 pi d_p / 10 for every place p of v] and digit-linear [d_p per place] (Levy &
    Geva's per-digit reading against a linear digit code); and at every dimension m those families have, the
    rivals of equal size: pca-m and poly-m (powers 1..m of the centred, scaled v; poly-1 would be linear).

Usage
    >>> fams = families(10, 100, digit_split=True)                        # [Family(...), ...]
    >>> fit = fit_family(means, values, train, fams[0], pca_dim=20)       # means [value, d_model] float64
    >>> fits = fit_families(means, 10, 100, fams, train, 20, seed=0, site="a.units", shuffles=3)  # + controls
    >>> patched = fit_patch(h, fit, i)                                    # h + Q Q^T (f(v_i) - h)

References: Kantamneni & Tegmark, ICML 2025, sec. 4.1-4.2 and Table 1; METHODS.md (number representations).
"""

from __future__ import annotations

import itertools
import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arithmech.errors import ConfigError

PERIODS: tuple[int, ...] = (2, 5, 10, 100)
"""Kantamneni & Tegmark's periods."""
KINDS: tuple[str, ...] = ("linear", "log", "circle", "circles", "helix", "pca", "poly", "digit-circles",
                          "digit-linear")  # fmt: skip
_RANK_TOL = 1e-6
"""A fit direction whose singular value is below this share of the largest is dropped from Q."""


@dataclass(frozen=True)
class Family:
    """One reading of the numbers: its kind, periods (circle, circles, helix) and dimension m."""

    kind: str
    periods: tuple[int, ...] = ()
    dim: int = 1
    operands: tuple[str, ...] = ()
    """The numbers it reads, each with its own columns ("a", "b", "a+b": the Clock, `analysis/clock_fits.py`);
    empty: the one value v of the site."""

    @property
    def name(self) -> str:
        """ "linear", "circle-10", "helix-2-5-10", "pca-7", "digit-circles", "helix-5-10(a,b,a+b)", ..."""
        if self.kind in ("circle", "helix"):
            base = f"{self.kind}-" + "-".join(str(t) for t in self.periods)
        elif self.kind in ("pca", "poly"):
            base = f"{self.kind}-{self.dim}"
        else:
            base = self.kind
        return base + (f"({','.join(self.operands)})" if self.operands else "")


def shown_periods(low: int, high: int, periods: Sequence[int] = PERIODS) -> tuple[int, ...]:
    """The periods a range low..high-1 can show: at most its number of values (one whole period)."""
    return tuple(t for t in periods if t <= high - low)


def n_places(high: int) -> int:
    """Digits of the largest operand high - 1 (places of the digit families)."""
    return len(str(max(high - 1, 0)))


def circle_dim(periods: Sequence[int]) -> int:
    """Columns of the circles of `periods`: cos and sin each, but period 2 has only cos (sin(pi n) = 0 on integers)."""
    return sum(1 if t == 2 else 2 for t in periods)


def families(low: int, high: int, digit_split: bool, periods: Sequence[int] = PERIODS) -> list[Family]:
    """Every family of the module docstring for operands low..high-1, in table order."""
    shown = shown_periods(low, high, periods)
    out = [Family("linear"), Family("log")]
    out += [Family("circle", (t,), circle_dim((t,))) for t in shown]
    if len(shown) > 1:
        out.append(Family("circles", shown, circle_dim(shown)))
    for size in range(1, min(4, len(shown)) + 1):
        out += [Family("helix", subset, 1 + circle_dim(subset)) for subset in itertools.combinations(shown, size)]
    if digit_split:
        places = n_places(high)
        out += [Family("digit-circles", (), 2 * places), Family("digit-linear", (), places)]
    for size in sorted({f.dim for f in out}):  # a rival of equal size for every family (poly-1 is linear)
        out += [Family("pca", (), size)] + ([Family("poly", (), size)] if size > 1 else [])
    return out


def select_families(available: Sequence[Family], names: Sequence[str] | None) -> list[Family]:
    """The families named (by `Family.name` or by kind, e.g. "helix" for every helix); all when None."""
    if names is None:
        return list(available)
    known = {f.name for f in available} | {f.kind for f in available}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"family {unknown[0]!r} is not one this range gives; choose among "
            f"{', '.join(sorted({f.kind for f in available}))} or the names {', '.join(f.name for f in available)}"
        )
    return [f for f in available if f.name in names or f.kind in names]


def basis(family: Family, values: torch.Tensor, low: int, high: int) -> torch.Tensor:
    """The family's basis B [value, m] (float64) at integer values [value]; pca has none (ValueError)."""
    v = values.to(torch.float64)
    cols: list[torch.Tensor] = []
    if family.kind == "linear":
        cols = [v]
    elif family.kind == "log":
        cols = [torch.log1p(v)]
    elif family.kind in ("circle", "circles", "helix"):
        cols = [v] if family.kind == "helix" else []
        for t in family.periods:
            angle = 2 * math.pi * torch.remainder(values.to(torch.long), t).to(torch.float64) / t
            cols += [torch.cos(angle)] + ([torch.sin(angle)] if t > 2 else [])  # sin(pi n) = 0: no column
    elif family.kind == "poly":
        x = (v - (low + high - 1) / 2) / max((high - 1 - low) / 2, 1)  # in [-1, 1]
        cols = [x**p for p in range(1, family.dim + 1)]
    elif family.kind in ("digit-circles", "digit-linear"):
        n = values.to(torch.long)
        for place in range(n_places(high)):
            digit = ((n // 10**place) % 10).to(torch.float64)
            if family.kind == "digit-linear":
                cols.append(digit)
            else:
                cols += [torch.cos(2 * math.pi * digit / 10), torch.sin(2 * math.pi * digit / 10)]
    else:
        raise ValueError(f"family {family.name} has no basis")
    return torch.stack(cols, dim=1)  # [value, m]


@dataclass(frozen=True)
class Fit:
    """A family fitted at one site and layer: the subspace it patches and its reconstruction of every value."""

    family: Family
    q: torch.Tensor  # [d_model, r] orthonormal
    mean: torch.Tensor  # [d_model] mu over the train values
    recon: torch.Tensor | None  # [value, d_model] r(v) for every value given to fit_basis; None from fit_families
    pred: torch.Tensor | None  # [value, d_model] f(v): leave-one-out on train values, r(v) on held-out ones (pca:
    # r(v)); None once a stage has patched with a shuffled control (only its subspace and W are kept)
    r2: float  # share of the variance of Z explained on the train values (pca-m: the share its m directions hold)
    w: torch.Tensor | None = None  # [d_model, m] what each basis column writes (W = P C^T); None for pca

    @property
    def rank(self) -> int:
        return int(self.q.shape[1])


def heldout_split(values: Sequence[int], share: float, seed: int) -> list[int]:
    """The held-out values: round(share x n) of them (at least 1 when share > 0 and n > 1), seeded."""
    values = sorted(set(values))
    n = round(share * len(values))
    if share > 0 and len(values) > 1:
        n = min(max(n, 1), len(values) - 1)
    return sorted(random.Random(f"{seed}:numbers-heldout").sample(values, n))


def principal_directions(means: torch.Tensor, train: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mu [d_model], P [d_model, k]): the train values' mean and top k principal directions of means
    [value, d_model]."""
    mu = means[train].mean(0)
    _, _, vh = torch.linalg.svd(means[train] - mu, full_matrices=False)  # vh [min(n, d), d_model]
    return mu, vh[:k].T


def fit_family(
    means: torch.Tensor,
    values: torch.Tensor,
    train: torch.Tensor,
    family: Family,
    pca_dim: int,
    low: int,
    high: int,
    permutation: torch.Tensor | None = None,
    pca: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Fit:
    """The fit of the module docstring. means [value, d_model] (float64), values [value] the integers they
    belong to, train [value] bool; permutation [n_train]: the shuffled control's pi over the train values (in
    their order); pca: `principal_directions` already computed (else computed here)."""
    b = None if family.kind == "pca" else basis(family, values, low, high)  # [value, m]
    return fit_basis(means, b, train, family, pca_dim, permutation, pca)


def fit_basis(
    means: torch.Tensor,
    b: torch.Tensor | None,
    train: torch.Tensor,
    family: Family,
    pca_dim: int,
    permutation: torch.Tensor | None = None,
    pca: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Fit:
    """`fit_family` for any rows: means [row, d_model] (float64; a value's mean, or one prompt's activation),
    b [row, m] the family's basis at each row (None for PCA), train [row] bool; the rest as `fit_family`."""
    mu, p = pca if pca is not None else principal_directions(means, train, pca_dim)
    x = means - mu  # [row, d_model]
    if b is None:
        q = p[:, : family.dim]
        z = x[train] @ p  # [train, k]
        kept = (z[:, : family.dim] ** 2).sum() / (z**2).sum().clamp_min(1e-30)
        recon = mu + (x @ q) @ q.T  # [row, d_model]
        return Fit(family, q, mu, recon, recon, float(kept))
    if permutation is not None:
        idx = train.nonzero().flatten()
        b = b.clone()
        b[idx] = b[idx[permutation]]
    bbar = b[train].mean(0)
    z = x[train] @ p  # [train, k]
    coef = torch.linalg.pinv(b[train] - bbar) @ z  # [m, k]: least squares, the minimum-norm one if rank-deficient
    w = p @ coef.T  # [d_model, m]
    recon = mu + (b - bbar) @ w.T  # [row, d_model]
    u, s, _ = torch.linalg.svd(w, full_matrices=False)
    q = u[:, s > _RANK_TOL * s.max()] if s.numel() and s.max() > 0 else w[:, :0]
    resid = z - (b[train] - bbar) @ coef  # [train, k]
    r2 = 1 - float((resid**2).sum() / (z**2).sum().clamp_min(1e-30))
    pred = recon.clone()
    pred[train] = mu + _leave_one_out(b[train] - bbar, z, resid) @ p.T
    return Fit(family, q, mu, recon, pred, r2, w)


def _leave_one_out(centred: torch.Tensor, z: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
    """z_loo [train, k]: each train row predicted by the least squares (with intercept) of the others (PRESS)."""
    n = centred.shape[0]
    design = torch.cat([torch.ones(n, 1, dtype=centred.dtype), centred], dim=1)  # [train, 1 + m]
    lev = (design * torch.linalg.pinv(design).T).sum(1)  # [train]: diag of H = X pinv(X)
    free = 1 - lev
    loo = z - resid / free.clamp_min(1e-12)[:, None]
    others = -z / max(n - 1, 1)  # the others' mean (z is centred): the prediction where the others say nothing
    return torch.where((free > 1e-9)[:, None], loo, others)


def fit_families(means: torch.Tensor, low: int, high: int, fams: Sequence[Family], train: torch.Tensor, pca_dim: int,
                 seed: int, site: str, shuffles: int) -> dict[tuple[str, int], Fit]:  # fmt: skip
    """Every family and its `shuffles` shuffled controls at one site and layer (`fit_rows`), means [value,
    d_model] over low..high-1 with NaN rows for values without prompts (their pred stays NaN). Only the prediction
    is kept per value, not the reconstruction: at every site, layer, family and control of a 7B model, each
    [value, d_model] float64 tensor kept is GiBs."""
    values = torch.arange(low, high)
    seen = ~torch.isnan(means[:, 0])
    bases = {f.name: None if f.kind == "pca" else basis(f, values[seen], low, high) for f in fams}
    out = {}
    for key, fit in fit_rows(means[seen], bases, fams, train[seen], pca_dim, seed, site, shuffles).items():
        pred = torch.full((len(values), means.shape[1]), float("nan"), dtype=torch.float64)
        pred[seen] = fit.pred
        out[key] = Fit(fit.family, fit.q, fit.mean, None, pred, fit.r2, fit.w)
    return out


def fit_rows(acts: torch.Tensor, bases: dict[str, torch.Tensor | None], fams: Sequence[Family], train: torch.Tensor,
             pca_dim: int, seed: int, site: str, shuffles: int) -> dict[tuple[str, int], Fit]:  # fmt: skip
    """(family name, k) -> the fit (k = 0) or its k-th shuffled control (PCA has none: no order to shuffle) of
    acts [row, d_model], bases[name] [row, m] (None: PCA); one PCA shared by all families; each family's
    permutations seeded by (seed, site, family)."""
    pca = principal_directions(acts, train, pca_dim)
    out: dict[tuple[str, int], Fit] = {}
    for fam in fams:
        perm_gen = seeded(seed, site, fam.name)
        perms = [torch.randperm(int(train.sum()), generator=perm_gen) for _ in range(shuffles)]
        for k in range(1 + (shuffles if fam.kind != "pca" else 0)):
            out[(fam.name, k)] = fit_basis(acts, bases[fam.name], train, fam, pca_dim, perms[k - 1] if k else None,
                                           pca)  # fmt: skip
    return out


def fit_patch(h: torch.Tensor, fit: Fit, value: torch.Tensor) -> torch.Tensor:
    """h + Q Q^T (f(v) - h) [prompt, d_model]: the fit's prediction of each prompt's value (indices into the
    values given to fit_family) in its subspace, h [prompt, d_model] (the corrupted run's) everywhere else."""
    assert fit.pred is not None, "a fit whose prediction was dropped patches nothing"
    return h + ((fit.pred[value] - h) @ fit.q) @ fit.q.T


def seeded(seed: int, *labels: object) -> torch.Generator:
    """A generator of its own for the draws of one part of a run (a site, a layer's family, the Clock's heads):
    seeded by (seed, labels), so that no draw moves when another part draws more (more families, sites, shuffles)."""
    return torch.Generator().manual_seed(zlib.crc32(":".join(str(x) for x in (seed, *labels)).encode()))


def random_subspace(d_model: int, rank: int, generator: torch.Generator) -> torch.Tensor:
    """An orthonormal basis [d_model, rank] of a uniformly random subspace (the ablation's control)."""
    g = torch.randn(d_model, rank, generator=generator, dtype=torch.float64)
    q, _ = torch.linalg.qr(g)
    return q
