"""Causal mediation analysis: the indirect effect of every MLP and attention output at every token position.

Background
    Stolfo et al. (2023) locate arithmetic in a model by intervening on one component at a time. A base prompt
    ("3 + 5 = ", result r = 8) and an alternative prompt of the same template ("2 + 4 = ", r' = 6) are run; the
    base run is repeated with one component's output at one token position p set to its value on the
    alternative. If the component at p carries the result, the intervened run moves probability from r to r'.
    Comparing arithmetic with number retrieval and factual recall (`data/mediation_prompts.py`) shows whether
    the components that matter are specific to arithmetic. (METHODS.md sec. 5.)

Formula
    For a site z = (component c in {mlp, attn}, layer l, position p), with P the base run's next-token
    probabilities at END and P*_z those of the intervened run (both softmax over the full vocabulary, float32):

        IE(z) = 1/2 * [ (P(r) - P*_z(r)) / P*_z(r) + (P*_z(r') - P(r')) / P(r') ]

    The total effect TE is the same with P*_z replaced by the alternative prompt's own run P_alt. The mlp
    component is the MLP module's output, attn the attention output projection's output (o_proj; for
    Gemma 2/3 both before the post-norm), each at position p only. Shapes:

        ie              [pair, component, layer, pos]   NaN beyond a pair's length
        position_class  [pair, pos]                     index into POSITION_CLASSES, -1 beyond a pair's length
        by_class()      [component, layer, class]       mean over a class's positions, then mean (or median)
                                                        over pairs

    Accuracy restricted to number tokens (Stolfo et al.): whether argmax over the number tokens 0..max_number
    of the base run's END logits is r (NaN for factual pairs).

    Neuron level, at one layer l and END only: IE of setting one MLP neuron's activation (the input of the MLP's
    down projection, `ModelView.down_proj`) to its alternative value; `top_neurons` and `neuron_overlap`
    (|A ∩ B| / k of the top-k neurons of two tasks).

How it is computed
    Per pair: one forward pass of [base; alternative] reads P, P_alt, caches every site's alternative value, the
    base run's residual entering every layer and its keys/values. Then, for each position p, the interventions
    of every (component, layer) at p are the rows of one batched pass (chunks of at most `max_rows` rows): row
    j's hook replaces position p of site j's output in row j only, and P*(r) and P*(r') are read from the same
    row. Three exact savings:
    - an intervention at p cannot change positions before p, so the rows run tokens p..END only, on the base
      run's keys/values of positions < p (indexed out of its cache, never copied per row); with a few-shot
      prefix most of the prompt is never recomputed;
    - an intervention at layer l cannot change the layers below l, so each row joins at its site's layer from
      the base run's residual there (`models/from_layer.run_from_layers`): about half the layer-rows;
    - positions before the first token where base and alternative differ have identical activations in both
      runs (causal attention), so their IE is exactly 0 and they are not run.
    Neurons: the rows are neurons of one layer, all at END, so each batch is a single-token step from that
    layer on the cached prompt.
    Base and alternative must have the same token length (`tokenize_mediation_pairs` rejects and counts
    mismatches; no padding is needed since every forward pass holds one pair).

Usage
    >>> items, report = tokenize_mediation_pairs(handle.tokenizer, pairs)
    >>> result = mediation_effects(handle.view, items)
    >>> result.by_class()[COMPONENTS.index("mlp")]            # [layer, class] heatmap
    >>> ie = neuron_effects(handle.view, items, layer=20)      # [pair, neuron]
    >>> neuron_overlap(ie_arith.mean(0), ie_facts.mean(0), k=20)

References: Stolfo, Belinkov, Sachan, EMNLP 2023 (arXiv 2305.15054), sec. 3 (IE/TE, position classes) and
sec. 4 (specificity: number retrieval, factual knowledge; neuron overlap); METHODS.md sec. 5.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from arithmech.data.mediation_prompts import COMPONENTS
from arithmech.data.mediation_tokens import POSITION_CLASSES, TokenizedMediationPair
from arithmech.errors import ConfigError
from arithmech.models.from_layer import JoiningRows, run_from_layers
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.shared_prefix import full_cache, prefix_cache
from arithmech.models.view import ModelView, cache_kwarg
from arithmech.patching.mediation_cost import intervention_blocks


def indirect_effect(
    p_r: torch.Tensor, p_alt_r: torch.Tensor, p_star_r: torch.Tensor, p_star_alt_r: torch.Tensor
) -> torch.Tensor:
    """1/2 [(P(r) - P*(r)) / P*(r) + (P*(r') - P(r')) / P(r')], elementwise (P = base, P* = intervened)."""
    return 0.5 * ((p_r - p_star_r) / p_star_r + (p_star_alt_r - p_alt_r) / p_alt_r)


@dataclass(frozen=True)
class MediationResult:
    """Per-position indirect effects of every pair, with the numbers behind them."""

    ie: torch.Tensor  # [pair, component, layer, pos] float32, NaN beyond a pair's length
    position_class: torch.Tensor  # [pair, pos] long, -1 beyond a pair's length
    total_effect: torch.Tensor  # [pair]
    probs: torch.Tensor  # [pair, 4]: P(r), P(r'), P_alt(r), P_alt(r')
    number_correct: torch.Tensor  # [pair] 1.0 / 0.0, NaN for non-numeric pairs
    layers: tuple[int, ...]
    components: tuple[str, ...]

    def per_pair_by_class(self) -> torch.Tensor:
        """[pair, component, layer, class]: each pair's mean IE over the positions of each class (NaN where the
        pair has no such position, e.g. operand2 for facts)."""
        valid = self.position_class >= 0  # [pair, pos]
        onehot = nn.functional.one_hot(self.position_class.clamp(min=0), len(POSITION_CLASSES))
        onehot = (onehot * valid[..., None]).float()  # [pair, pos, class]
        sums = torch.einsum("pclt,ptk->pclk", self.ie.nan_to_num(0.0), onehot)  # [pair, component, layer, class]
        counts = onehot.sum(1)[:, None, None, :]  # [pair, 1, 1, class]
        return sums / counts  # 0 / 0 = NaN for a missing class

    def by_class(self, statistic: str = "mean") -> torch.Tensor:
        """[component, layer, class]: `per_pair_by_class` reduced over the pairs that have the class.

        "mean" is Stolfo et al.'s; "median" resists the few pairs where P*(r) is tiny and one ratio dominates.
        """
        per_pair = self.per_pair_by_class()
        if statistic == "mean":
            return per_pair.nanmean(0)
        if statistic == "median":
            return per_pair.nanmedian(0).values
        raise ConfigError(f"statistic must be mean or median; got {statistic!r}")

    def number_accuracy(self) -> float:
        """Accuracy restricted to number tokens over the numeric pairs (NaN if there are none)."""
        return float(self.number_correct.nanmean())


@torch.no_grad()
def mediation_effects(
    view: ModelView,
    items: Sequence[TokenizedMediationPair],
    layers: Sequence[int] | None = None,
    components: Sequence[str] = COMPONENTS,
    max_rows: int = 256,
    progress: Callable[[int], None] | None = None,
) -> MediationResult:
    """IE of each component in `components` at each layer in `layers` (default all) and every position.

    progress: called with 1 after each pair (e.g. a tqdm bar's update).
    """
    layers = tuple(range(view.dims.n_layers)) if layers is None else tuple(layers)
    components = tuple(components)
    _check(view, items, layers, components, max_rows)
    width = max(len(item.base_ids) for item in items)
    ie = torch.full((len(items), len(components), len(layers), width), float("nan"))
    position_class = torch.full((len(items), width), -1, dtype=torch.long)
    probs = torch.empty(len(items), 4)
    correct = torch.full((len(items),), float("nan"))
    sites = [(c, layer) for c in components for layer in layers]  # site s = (component, layer)
    modules = [_component_module(view, c, layer) for c, layer in sites]
    blocks = intervention_blocks([layer for _, layer in sites], max_rows)  # rows join the pass by layer
    for i, item in enumerate(items):
        n = len(item.base_ids)
        base = None  # the last pair's cache, residuals and values go before this pair's run makes its own
        base = _base_and_alt(view, item, modules, lambda inputs, output: first_tensor(output))
        probs[i] = torch.cat([_probs(base.logits[0], item), _probs(base.logits[1], item)])
        if item.number_ids is not None:
            ids = torch.tensor(item.number_ids)
            correct[i] = float(int(ids[base.logits[0, ids].argmax()]) == item.result_id)
        position_class[i, :n] = item.position_class
        first = _first_difference(item)
        ie[i, :, :, :n] = 0.0  # positions before `first` are identical in both runs: IE exactly 0
        for p in range(first, n):  # one batch of rows per position: row j = site block[j]'s intervention at p
            for block in blocks:  # [row] site ids, by layer
                post = [(modules[s], _set_row(j, base.alt_values[s][p])) for j, s in enumerate(block)]
                layer_of = torch.tensor([sites[s][1] for s in block])
                with hooks(post=post):
                    star = base.run_from(view, item, p, layer_of)  # [row, d_vocab]
                p_star = _probs_rows(star, item)  # [row, 2]
                del star  # the block's logits, before the next block's run
                effect = indirect_effect(probs[i, 0], probs[i, 1], p_star[:, 0], p_star[:, 1])
                site_ids = torch.tensor(block)  # site s = component index * len(layers) + layer index
                ie[i, site_ids // len(layers), site_ids % len(layers), p] = effect
        if progress is not None:
            progress(1)
    total = indirect_effect(probs[:, 0], probs[:, 1], probs[:, 2], probs[:, 3])
    return MediationResult(ie, position_class, total, probs, correct, layers, components)


@torch.no_grad()
def neuron_effects(
    view: ModelView,
    items: Sequence[TokenizedMediationPair],
    layer: int,
    neurons: Sequence[int] | None = None,
    max_rows: int = 512,
    progress: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """IE [pair, neuron] of setting each MLP neuron of `layer` at END to its value on the alternative.

    A neuron's activation is the input of the MLP's down projection (`ModelView.down_proj`); `neurons` defaults
    to all.
    progress: called with 1 after each pair.
    """
    _check(view, items, (layer,), COMPONENTS, max_rows)
    module = view.down_proj(layer)
    d_mlp = int(module.weight.shape[0] if view.spec.conv1d else module.weight.shape[1])
    chosen = torch.arange(d_mlp) if neurons is None else torch.as_tensor(list(neurons), dtype=torch.long)
    if len(chosen) == 0 or int(chosen.min()) < 0 or int(chosen.max()) >= d_mlp:
        raise ConfigError(f"neurons must be indices in 0..{d_mlp - 1} of layer {layer}'s MLP")
    out = torch.zeros(len(items), len(chosen))
    for i, item in enumerate(items):
        end = len(item.base_ids) - 1
        base = None  # the last pair's states go first (as in mediation_effects)
        base = _base_and_alt(view, item, [module], lambda inputs, output: inputs[0], pre=True)
        p = _probs(base.logits[0], item)
        if _first_difference(item) > end:
            if progress is not None:
                progress(1)
            continue  # identical prompts: every IE is 0
        (alt_act,) = base.alt_values
        for start in range(0, len(chosen), max_rows):
            block = chosen[start : start + max_rows]  # one row per neuron
            with hooks(pre=[(module, _set_neurons(block, alt_act[end, block]))]):
                star = base.run_from(view, item, end, torch.full((len(block),), layer))  # [row, d_vocab]
            p_star = _probs_rows(star, item)  # [row, 2]
            del star  # the block's logits, before the next block's run
            out[i, start : start + len(block)] = indirect_effect(p[0], p[1], p_star[:, 0], p_star[:, 1])
        if progress is not None:
            progress(1)
    return out


def top_neurons(effects: torch.Tensor, k: int) -> list[int]:
    """Indices of the k largest effects; `effects` is [neuron] or [pair, neuron] (then averaged over pairs)."""
    mean = effects.nanmean(0) if effects.dim() == 2 else effects
    if not 0 < k <= mean.numel():
        raise ConfigError(f"k must be in 1..{mean.numel()} (the number of neurons); got {k}")
    return mean.topk(k).indices.tolist()


def neuron_overlap(effects_a: torch.Tensor, effects_b: torch.Tensor, k: int) -> float:
    """|A ∩ B| / k for A, B the top-k neurons by IE of two tasks (each [neuron] or [pair, neuron])."""
    return len(set(top_neurons(effects_a, k)) & set(top_neurons(effects_b, k))) / k


# -- internals ----------------------------------------------------------------------------------------------
def _check(
    view: ModelView, items: Sequence[TokenizedMediationPair], layers: tuple[int, ...], components: tuple, rows: int
) -> None:
    if not items:
        raise ConfigError("there are no tokenized mediation pairs; generate and tokenize some first")
    bad = [layer for layer in layers if not 0 <= layer < view.dims.n_layers]
    if bad or not layers:
        raise ConfigError(f"layers must be a non-empty list in 0..{view.dims.n_layers - 1}; got {list(layers)}")
    if not components or any(c not in COMPONENTS for c in components):
        raise ConfigError(f"components must be drawn from {', '.join(COMPONENTS)}; got {list(components)}")
    if rows < 1:
        raise ConfigError(f"max_rows must be >= 1; got {rows}")
    for item in items:
        if item.base_ids.shape != item.alt_ids.shape:
            raise ConfigError("a base and alternative prompt differ in token length; tokenize with "
                              "tokenize_mediation_pairs, which rejects such pairs")  # fmt: skip


def _component_module(view: ModelView, component: str, layer: int) -> nn.Module:
    return view.mlp(layer) if component == "mlp" else view.o_proj(layer)


def _first_difference(item: TokenizedMediationPair) -> int:
    """The first position where base and alternative tokens differ (the length if none)."""
    differs = (item.base_ids != item.alt_ids).nonzero().flatten()
    return int(differs[0]) if len(differs) else len(item.base_ids)


def _device(view: ModelView) -> torch.device:
    return view.o_proj(0).weight.device


@dataclass(frozen=True)
class _BaseRun:
    """One forward pass of [base; alternative]: END logits, the sites' alternative values, and what the
    intervened rows start from (the base run's residual entering every layer and its keys/values)."""

    logits: torch.Tensor  # [2, d_vocab] float32
    alt_values: list[torch.Tensor]  # per module [pos, ...]
    resid: list[torch.Tensor]  # per layer [pos, d_model]: the base run's residual entering it
    cache: Any  # the run's keys/values of every position (`full_cache`)

    def run_from(self, view: ModelView, item: TokenizedMediationPair, pos: int, layer: torch.Tensor) -> torch.Tensor:
        """END logits [row, d_vocab] of base-prompt rows that join at `layer` [row] (sorted), positions pos..END."""
        resid = torch.stack([self.resid[int(x)][pos:] for x in layer])  # [row, pos.., d_model]
        rows = JoiningRows(torch.zeros(len(layer), dtype=torch.long), layer, resid)
        prefix = prefix_cache(view, self.cache, torch.zeros(1, dtype=torch.long), pos) if pos > 0 else None
        final = run_from_layers(view, rows, item.base_ids[None, pos:], prefix=prefix)  # [row, pos.., d_model]
        return view.vocab_logits(final[:, -1])  # [row, d_vocab], the float32 readout of base and intervened runs


def _base_and_alt(
    view: ModelView,
    item: TokenizedMediationPair,
    modules: list[nn.Module],
    read: Callable[[tuple[Any, ...], Any], torch.Tensor],
    pre: bool = False,
) -> _BaseRun:
    """The run of [base; alternative], each module's alternative value read by `read(inputs, output)`."""
    values: list[Any] = [None] * len(modules)
    resid: list[Any] = [None] * view.dims.n_layers

    def save(s: int) -> Any:
        if pre:
            return lambda _m, args: values.__setitem__(s, read(args, None)[1].detach().clone())
        return lambda _m, args, output: values.__setitem__(s, read(args, output)[1].detach().clone())

    def save_resid(layer: int) -> Any:
        return lambda _m, args: resid.__setitem__(layer, args[0][0].detach())

    hooked = [(m, save(s)) for s, m in enumerate(modules)]
    entering = [(view.attn_norm(layer), save_resid(layer)) for layer in range(view.dims.n_layers)]
    cache = full_cache()
    ids = torch.stack([item.base_ids, item.alt_ids]).to(_device(view))
    with hooks(pre=[*entering, *(hooked if pre else ())], post=() if pre else hooked):
        final = view.final_resid(input_ids=ids, use_cache=True, **{cache_kwarg(view.model.base_model): cache})
    return _BaseRun(view.vocab_logits(final[:, -1]), values, resid, cache)


def _probs(logits: torch.Tensor, item: TokenizedMediationPair) -> torch.Tensor:
    """[P(r), P(r')] from one row of logits [d_vocab]."""
    return _probs_rows(logits[None], item)[0]


def _probs_rows(logits: torch.Tensor, item: TokenizedMediationPair) -> torch.Tensor:
    """[row, 2]: P(r), P(r') of each row, both from the same softmax."""
    probs = logits.float().softmax(-1)
    return probs[:, [item.result_id, item.alt_result_id]].cpu()


def _set_row(row: int, value: torch.Tensor) -> Any:
    """Post-hook for a batch that starts at the intervened position: output[row, 0] = value [d_model]."""

    def fn(_module: nn.Module, _args: Any, output: Any) -> Any:
        out = first_tensor(output).clone()  # [row, pos from p, d_model]
        out[row, 0] = value.to(out.device, out.dtype)
        return (out, *output[1:]) if isinstance(output, tuple) else out

    return fn


def _set_neurons(neurons: torch.Tensor, values: torch.Tensor) -> Any:
    """Pre-hook on the down projection: row j's neuron neurons[j] at the (single, END) position = values[j]."""

    def fn(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0].clone()  # [row, 1, d_mlp]
        rows = torch.arange(len(neurons), device=x.device)
        x[rows, -1, neurons.to(x.device)] = values.to(x.device, x.dtype)
        return (x, *args[1:])

    return fn
