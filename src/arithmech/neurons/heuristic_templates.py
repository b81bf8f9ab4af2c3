"""Heuristic templates and the match score of a neuron's activation pattern (Nikankin et al., ICLR 2025).

Background
    Nikankin et al. ("Arithmetic Without Algorithms", sec. 4) find that most arithmetic-relevant MLP neurons
    fire for a simple set of operand pairs: an operand in a range, an operand (or the result) congruent to
    m mod q, the result in a range, both operands equal... Each such set is a template T, a subset S_T of
    the operand grid G (the pairs (A, B) the model answers). A neuron implements T when its highest values
    over G are exactly the pairs of S_T.

Templates (`heuristic_templates`; the families of the paper's code, `heuristics_classification.py`)
    operand_value   op1 == v, op2 == v                   operand_range   s <= op_i < s + w (steps of w)
    operand_mod     op_i = m mod q, q = 2..10            both_range      both operands in the same range
    both_mod        both operands = m mod q              same_operand    op1 == op2
    result_value    C == v                               result_range    s <= C < s + w (steps of max(1, w // 3))
    result_mod      C = m mod q
    Range widths are the paper's (10, 30, 50, 100 for operands; 10, 30, 50 for results) and, for grids of
    single-digit numbers, 2, 3 and 5, each kept when it is below the range it covers. Sets with fewer than
    `MIN_SUPPORT` pairs or more than `MAX_SHARE` of the grid are left out (a set of 80% of the grid scores 0.8
    on any neuron), and of two templates with the same set the first is kept. Not ported: the paper's
    digit-wildcard patterns ("1.3") for three-digit numbers and division's multi-value results.

Match score (defined once, here)
    For a neuron with activation m_p at END over the pairs p of G and a template T with k = |S_T|:

        w_p(k)   = 1 if m_p > t,  (k - #{q: m_q > t}) / #{q: m_q = t} if m_p = t,  0 otherwise
                   with t the k-th largest value of m (so sum_p w_p = k; ties share the last places)
        score(T) = sum_{p in S_T} w_p(k) / k                                                     in [0, 1]

    the share of the neuron's k highest-activated pairs that belong to S_T (the paper's precision at k = |S_T|,
    with ties split evenly, so a constant map scores k / |G|, chance, instead of matching by grid order).
    Scored on m and on -m (a neuron may encode T by its lowest values: SiLU and GELU reach below zero); the
    direction with the higher score is kept.

Every template is scored on the activation; the answer enters only through a result template's set
    Nikankin et al.'s code can also score on a "KV" map, the activation times what the neuron's output writes to
    each pair's answer logit (our direct effect DE_p = m_p * u(c_p), `heuristic_scan`). On that map the answer
    is built into the values: u(c) depends on the answer c alone, so any neuron whose activation keeps one
    sign ranks the pairs by u(c_p), i.e. by their result, and matches a result template with no pattern over
    the grid at all (measured: activations ~ N(1, 0.3) i.i.d. over the 55 addition pairs matched 99% of the
    time). A null that shuffles the whole DE map breaks that built-in link and so reports ~1% "chance"; the
    null that keeps it (permute m over the pairs, recompute DE with each pair's own answer) classifies those
    neurons just as often, so on DE the rule cannot tell a heuristic from a constant. Scored on m, a result
    template asks the question the heuristic poses, "does the neuron fire for the pairs whose result is in
    S_T?", and the null is exact: under "m has no structure over the grid" (m exchangeable over the pairs)
    the order of the pairs by m is uniformly random, whatever the answers are. What a neuron writes to the
    answer is measured separately: DE ranks the neurons of the ablation (`heuristic_scan`).

Two families, each classified on its own
    operand templates (operand_*, both_*, same_operand) and result templates (result_*). A neuron gets its
    best template of each family. With x = floor(score * k) pairs of S_T among the top k, and
    X ~ Hypergeometric(|G|, k, k) the overlap of a random k-subset with S_T,

        p = P(X >= x) = sum_{j >= x} C(k, j) C(|G| - k, k - j) / C(|G|, k)
        classified in family F  <=>  score >= 0.6  and  p <= 0.05 / (2 * #templates of F)   (Bonferroni)

    The paper calls a neuron classified when its best score is at least 0.6, on a 300 x 300 grid where chance
    cannot reach that. On a grid of single-digit operands (55 addition pairs) the best of a family's ~40-70
    small templates reaches 0.6 by chance for most random neurons; the p-value condition asks for a match
    unlikely under a random order of the pairs. On large grids this is the paper's rule; on small ones it asks
    for near-perfect matches. Under the null each family's rule lets through at most 5% of the neurons
    (Bonferroni: usually far fewer).

Overlap of the two families (`family_overlap`)
    The families are classified apart, so a neuron can be classified by both: a set of one family can cover most
    of a set of the other on a small grid (results 0-2 are pairs of operands 0-2; an even result is two operands
    of one parity, so both_0mod2 lies inside result_0mod2), and a neuron that tracks the result can also match
    an operand template (its top pairs for one k the result set, for another k mostly an operand range). The
    families are not made exclusive (a rule picking one would change what each family's null measures); each
    layer reports its neurons classified by operand templates only, by result templates only, and by both, and
    "both" is read against the same null (the permuted activations classified by both families).

Null
    `shuffled_best` permutes every neuron's activations over the pairs (seeded, one permutation per neuron)
    and classifies them again, per family: the fraction it classifies is the rule's false-positive rate on
    this grid, the level a family's classified fraction is read against.

Usage
    >>> templates = heuristic_templates(operands, results)               # operands [n, 2], results [n]
    >>> best = classify_families(activation, templates)                  # activation [neuron, n]
    >>> best["result"].classified(), best["result"].template             # [neuron] each, per family
    >>> null = shuffled_best(activation, templates, seed=0)              # the same, activations permuted
    >>> family_overlap({g: best[g].classified() for g in GROUPS})["both"]  # [neuron] classified by both

References: Nikankin, Reusch, Mueller, Belinkov, "Arithmetic Without Algorithms: Language Models Solve Math
With a Bag of Heuristics", ICLR 2025 (arXiv 2410.21272), sec. 4; code technion-cs-nlp/llm-arithmetic-heuristics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FAMILIES: tuple[str, ...] = (
    "operand_value", "operand_range", "operand_mod", "both_range", "both_mod", "same_operand",
    "result_value", "result_range", "result_mod",
)  # fmt: skip
RESULT_FAMILIES = frozenset({"result_value", "result_range", "result_mod"})
GROUPS: tuple[str, ...] = ("operand", "result")
"""The two families of templates classified apart: operand templates and result templates."""
OVERLAP: tuple[str, ...] = ("operand_only", "result_only", "both")
"""How a neuron classified by some family is classified (`family_overlap`)."""
OPERAND_WIDTHS = (2, 3, 5, 10, 30, 50, 100)
RESULT_WIDTHS = (2, 3, 5, 10, 30, 50)
MODULI = tuple(range(2, 11))
MIN_SUPPORT = 3
"""Fewest pairs a template's set may hold (one or two pairs at the top happen by chance)."""
MAX_SHARE = 0.5
"""Largest share of the grid a template's set may hold."""
THRESHOLD = 0.6
"""A neuron is classified when its best match score is at least this (Nikankin et al.'s code)..."""
ALPHA = 0.05
"""... and its match's family-wise chance probability is at most this (module docstring)."""


@dataclass(frozen=True)
class HeuristicTemplate:
    """One template: its name ("op1_range_0_5", "result_3mod4"), family, and set of grid pairs."""

    name: str
    family: str
    members: torch.Tensor  # [n_pairs] bool

    @property
    def group(self) -> str:
        """"result" for a template on the result, "operand" for one on the operands."""
        return "result" if self.family in RESULT_FAMILIES else "operand"


def heuristic_templates(operands: torch.Tensor, results: torch.Tensor) -> list[HeuristicTemplate]:
    """The templates of the module docstring over grid pairs `operands` [n, 2] with `results` [n]."""
    a, b, c = operands[:, 0].long(), operands[:, 1].long(), results.long()
    n = len(c)
    size, top = int(operands.max()) + 1, int(c.max()) + 1
    found: list[HeuristicTemplate] = []
    seen: set[bytes] = set()

    def add(name: str, family: str, members: torch.Tensor) -> None:
        k = int(members.sum())
        key = bytes(members.to(torch.uint8).tolist())
        if MIN_SUPPORT <= k <= MAX_SHARE * n and key not in seen:
            seen.add(key)
            found.append(HeuristicTemplate(name, family, members))

    for i, x in ((1, a), (2, b)):
        for v in range(size):
            add(f"op{i}_value_{v}", "operand_value", x == v)
        for w, s in _ranges(size, OPERAND_WIDTHS, step=lambda w: w):
            add(f"op{i}_range_{s}_{s + w}", "operand_range", (x >= s) & (x < s + w))
        for q in (q for q in MODULI if q < size):
            for m in range(q):
                add(f"op{i}_{m}mod{q}", "operand_mod", x % q == m)
    for w, s in _ranges(size, OPERAND_WIDTHS, step=lambda w: w):
        add(f"both_range_{s}_{s + w}", "both_range", (a >= s) & (a < s + w) & (b >= s) & (b < s + w))
    for q in (q for q in MODULI if q < size):
        for m in range(q):
            add(f"both_{m}mod{q}", "both_mod", (a % q == m) & (b % q == m))
    add("same_operand", "same_operand", a == b)
    for v in range(top):
        add(f"result_value_{v}", "result_value", c == v)
    for w, s in _ranges(top, RESULT_WIDTHS, step=lambda w: max(1, w // 3)):
        add(f"result_range_{s}_{s + w}", "result_range", (c >= s) & (c < s + w))
    for q in (q for q in MODULI if q < top):
        for m in range(q):
            add(f"result_{m}mod{q}", "result_mod", c % q == m)
    return found


def _ranges(limit: int, widths: tuple[int, ...], step: object) -> list[tuple[int, int]]:
    """(width, start) of every range [start, start + width) of the widths below `limit`."""
    assert callable(step)
    return [(w, s) for w in widths if w < limit for s in range(0, limit, int(step(w)))]


def topk_weights(x: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    """w(k) of the module docstring for every k of `ks` [K]: [neuron, n] maps -> [neuron, K, n] weights in
    [0, 1] that sum to k over n. One sort per map serves every k."""
    t = x.sort(dim=1, descending=True).values[:, ks - 1]  # [neuron, K]: the k-th largest value
    greater = x[:, None, :] > t[:, :, None]  # [neuron, K, n]
    equal = x[:, None, :] == t[:, :, None]
    left = ks[None, :, None] - greater.sum(-1, keepdim=True)  # [neuron, K, 1] places left for the tied values
    return greater.to(x.dtype) + equal.to(x.dtype) * left / equal.sum(-1, keepdim=True)


def match_scores(x: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """score(T) of every neuron [neuron, n] and template `members` [template, n] -> [neuron, template]."""
    sizes = members.sum(1)  # [template]
    ks = sizes.unique()  # [K]
    weights = topk_weights(x, ks)  # [neuron, K, n]
    out = torch.zeros(x.shape[0], members.shape[0], dtype=x.dtype)
    for i, k in enumerate(ks.tolist()):
        chosen = (sizes == k).nonzero().flatten()
        out[:, chosen] = weights[:, i] @ members[chosen].T.to(x.dtype) / k  # [neuron, chosen]
    return out


@dataclass(frozen=True)
class BestTemplates:
    """Per neuron: its best template (index into the template list), score, direction and chance probability."""

    template: torch.Tensor  # [neuron] long
    score: torch.Tensor  # [neuron]
    top: torch.Tensor  # [neuron] bool: True = highest values, False = lowest values
    p_value: torch.Tensor  # [neuron] P(X >= x) of the module docstring (uncorrected)
    n_tests: int
    """Templates x directions tested per neuron (the Bonferroni factor)."""

    def classified(self, threshold: float = THRESHOLD, alpha: float = ALPHA) -> torch.Tensor:
        return (self.score >= threshold) & (self.p_value <= alpha / max(self.n_tests, 1))


def classify(activation: torch.Tensor, templates: list[HeuristicTemplate]) -> BestTemplates:
    """The best of `templates` for every neuron, from its activation over the pairs [neuron, n]."""
    n_neurons, n = activation.shape
    if not templates:
        zeros = torch.zeros(n_neurons)
        return BestTemplates(zeros.long(), zeros, torch.ones(n_neurons, dtype=torch.bool), zeros + 1, 0)
    members = torch.stack([t.members for t in templates])  # [template, n]
    both = torch.stack([match_scores(sign * activation.float(), members) for sign in (1.0, -1.0)])
    per_direction, index = both.max(-1)  # [direction, neuron]
    top = per_direction[0] >= per_direction[1]
    score = torch.where(top, per_direction[0], per_direction[1])
    template = torch.where(top, index[0], index[1])
    k = members.sum(1)[template]  # [neuron]
    p = overlap_p_value(n, k, (score.double() * k + 1e-4).floor().long())  # 1e-4: float32 sums of weights
    return BestTemplates(template, score.float(), top, p.float(), 2 * len(templates))


def family_templates(templates: list[HeuristicTemplate]) -> dict[str, list[int]]:
    """Indices into `templates` of each family of `GROUPS`."""
    return {g: [i for i, t in enumerate(templates) if t.group == g] for g in GROUPS}


def classify_families(activation: torch.Tensor, templates: list[HeuristicTemplate]) -> dict[str, BestTemplates]:
    """Per family of `GROUPS`: every neuron's best template of that family (indices into `templates`)."""
    out = {}
    for group, idx in family_templates(templates).items():
        best = classify(activation, [templates[i] for i in idx])
        chosen = torch.tensor(idx, dtype=torch.long)[best.template] if idx else best.template
        out[group] = BestTemplates(chosen, best.score, best.top, best.p_value, best.n_tests)
    return out


def family_overlap(classified: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """[neuron] bool masks of `OVERLAP` from each family's classified mask: operand templates only, result
    templates only, both; a neuron of neither is in none."""
    operand, result = classified["operand"], classified["result"]
    return {"operand_only": operand & ~result, "result_only": result & ~operand, "both": operand & result}


def overlap_p_value(n: int, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """P(X >= x) for X ~ Hypergeometric(n, k, k): a random k-subset of n items holding x of a fixed k [neuron]."""
    j = torch.arange(int(k.max()) + 1, dtype=torch.float64)[None]  # [1, j]
    kk, xx = k.double()[:, None], x.double()[:, None]  # [neuron, 1]

    def log_choose(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma(a - b + 1)

    valid = (j <= kk) & (j >= xx) & (kk - j <= n - kk)
    jj = torch.minimum(j, kk)  # [neuron, j]; out-of-range terms are masked below
    terms = log_choose(kk, jj) + log_choose(n - kk, torch.minimum((kk - jj).clamp(min=0), n - kk))
    terms = torch.where(valid, terms - log_choose(torch.tensor(float(n)), kk), torch.tensor(float("-inf")))
    return terms.logsumexp(1).exp().clamp(max=1.0)  # [neuron]


def shuffled_best(
    activation: torch.Tensor, templates: list[HeuristicTemplate], seed: int
) -> dict[str, BestTemplates]:
    """`classify_families` after a seeded random permutation of every neuron's activations over the pairs (the
    null: the grid's answers stay where they are, only the activations move)."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.rand(activation.shape, generator=gen).argsort(dim=1)  # [neuron, n]: one permutation per neuron
    return classify_families(activation.gather(1, order), templates)
