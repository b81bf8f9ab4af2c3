"""Random heads matched in size to a head selection: k heads touching as many key/value groups, so precise SFT
trains exactly as many parameters on both sides of an effect-ranked vs random comparison.

Background
    Precise SFT (finetune/head_slices.py) trains, for every selected query head, its rows of W_Q (with their bias
    entries, where the model has a q bias) and its columns of W_O; and, for every key/value group that a selected
    head reads, that group's rows of W_K and W_V (and k/v bias entries), once, however many of the group's query
    heads are selected (grouped-query attention, METHODS.md sec. 7). With G = H / H_kv query heads per group and
    the same head sizes in every layer, a selection of k heads touching m groups trains

        P(k, m) = k * p_head + m * p_group,   p_head = d_head (d_model + q bias) + d_head d_model,
                                              p_group = 2 d_head (d_model + k/v bias)

    parameters. SmolLM2-135M (d_model 576, d_head 64, no biases, 9 query and 3 key/value heads per layer):
    p_head = p_group = 73,728. Its effect-ranked top-8 heads share groups (8 heads in 7 groups: 1,105,920) where 8
    heads drawn uniformly from all 270 usually do not (8 groups, 1,179,648, with probability 0.81); its top-32 sit
    in 22 groups (3,981,312), which a uniform draw of 32 heads matches with probability 1.6e-4 (81% of draws touch
    27-30 groups: 4.35-4.57 M parameters, 9-15% more). A random-k control drawn that way is a larger intervention
    than the top-k one it is compared with, and rejection sampling would need ~6,000 draws at k = 32.

The draw (`matched_random_heads`)
    Fixing k and m fixes P(k, m), so the control draws k heads touching exactly m groups, uniformly among all such
    sets of the model's L * H heads. Every set of m groups (of N = L * H_kv) holds the same number W(m, k) of
    k-head sets touching all m of them, so a uniform draw is, exactly and without rejection:

        1. m groups of the N, uniformly;
        2. how many heads each gets, (c_1, ..., c_m) with 1 <= c_i <= G and sum c_i = k, with probability
           prod_i C(G, c_i) / W(m, k), one group at a time, where W counts the k-head sets:
               W(0, 0) = 1, W(0, r > 0) = 0,   W(j, r) = sum_{c = 1}^{min(G, r)} C(G, c) W(j - 1, r - c);
        3. c_i of each chosen group's G query heads, uniformly.

    A set is drawn with probability 1 / (C(N, m) W(m, k)), the same for all of them. Exact integers throughout; a
    seeded `random.Random` makes the draw reproducible. It is impossible when m < ceil(k / G) (too few groups to
    hold k heads) or m > min(k, N): `ConfigError`. Multi-head attention (G = 1) has m = k always, and the draw is
    k heads uniformly from all. Heads may coincide with the selection they are matched to, as in knockout's
    random-rank control.

    The layers of the drawn heads are not matched, so the H / h_l scaling of each layer's slices (head_slices.py)
    differs between the sides, as it did before; only the number of trained parameters is made equal.

Usage
    >>> top = [Component(14, 2), Component(13, 6), Component(14, 6)]
    >>> heads = matched_random_heads(dims, len(top), len(kv_groups(top, dims.group_size)), random.Random("s0"))

References: Zhang et al. 2024 sec. 4.3 (precise SFT, random-head control); METHODS.md sec. 3 (random-rank
control) and sec. 7 (grouped-query attention).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from functools import cache
from math import comb

from arithmech.errors import ConfigError
from arithmech.models.sites import Component
from arithmech.models.view import Dims


def kv_groups(heads: Iterable[Component], group_size: int) -> set[tuple[int, int]]:
    """The (layer, kv group) pairs that the query heads read; G = group_size query heads share a group."""
    return {(c.layer, c.head // group_size) for c in heads if c.head is not None}


@cache
def _ways(groups: int, heads: int, group_size: int) -> int:
    """W(groups, heads): the sets of `heads` query heads in `groups` given groups of `group_size`, none empty."""
    if groups == 0:
        return int(heads == 0)
    return sum(
        comb(group_size, c) * _ways(groups - 1, heads - c, group_size) for c in range(1, min(group_size, heads) + 1)
    )


def _weighted(rng: random.Random, weights: list[int]) -> int:
    """An index drawn with probability weights[i] / sum(weights), exactly (integer weights)."""
    pick = rng.randrange(sum(weights))
    for i, w in enumerate(weights):
        if pick < w:
            return i
        pick -= w
    raise AssertionError("unreachable: pick < sum(weights)")


def matched_random_heads(dims: Dims, k: int, n_groups: int, rng: random.Random) -> list[Component]:
    """k heads drawn uniformly among the sets of k heads that touch exactly `n_groups` key/value groups (module
    docstring), sorted by layer and head."""
    g, n_all = dims.group_size, dims.n_layers * dims.n_kv_heads
    fewest, most = -(-k // g), min(k, n_all)  # ceil(k / G) groups hold k heads; each group needs one
    if not 0 < k <= dims.n_layers * dims.n_heads or not fewest <= n_groups <= most:
        raise ConfigError(
            f"no set of {k} heads touches exactly {n_groups} key/value groups in a model of {dims.n_layers} layers "
            f"x {dims.n_kv_heads} groups of {g} query heads (between {fewest} and {most} groups can)"
        )
    groups = sorted(rng.sample([(layer, kv) for layer in range(dims.n_layers) for kv in range(dims.n_kv_heads)],
                               n_groups))  # fmt: skip
    heads: list[Component] = []
    left = k
    for i, (layer, kv) in enumerate(groups):
        rest = n_groups - i - 1  # groups after this one, each needing at least one head
        counts = list(range(1, min(g, left) + 1))
        take = counts[_weighted(rng, [comb(g, c) * _ways(rest, left - c, g) for c in counts])]
        heads += [Component(layer, kv * g + h) for h in rng.sample(range(g), take)]
        left -= take
    return sorted(heads)
