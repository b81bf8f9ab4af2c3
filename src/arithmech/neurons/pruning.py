"""Neuron pruning: keep only the top-scored FFN neurons of the deep layers and measure what the model still does.

Background
    Yu & Ananiadou (2024) find that the deep FFN layers enhance the arithmetic prediction through a small set of
    neurons whose value vectors raise the answer token ("prediction enhancing"). If their comparative (CNA) or
    log-increase scores are faithful, a model that keeps only the top-scored neurons of those layers, with every
    other neuron of the same layers masked to zero, should still answer much better than a model that keeps the
    same number of neurons drawn at random. (METHODS.md sec. 6, last item.)

Formula
    For the pruned layers P (the "deep layers", e.g. the last half), scores s [len(P), d_mlp] (higher = more
    useful, e.g. `cna_scores(...).mean(0)`), and a keep size n:

        keep_top(n)     the n highest-scored neurons                                {layer: indices}
        keep_rand(n, r) n neurons drawn uniformly at random (repeat r = 0..R-1)     {layer: indices}
        m_lk <- m_lk * [k in keep(l)]   for every l in P, at every position       (`mask_neurons`)
        accuracy(keep)  = mean over prompts of [argmax logits at END == answer]
        mean_prob(keep) = mean over prompts of softmax(logits at END)[answer]

    Random pruning is reported as mean and sample sd over the R repeats. Every neuron kept reproduces the
    unpruned model bit for bit; none kept zeroes the FFN neuron activations of the pruned layers (the MLP
    then writes only its down projection's bias, if it has one).

Selection: global by default
    `selection="global"` ranks all neurons of P together and keeps the top n overall (n = total kept);
    `selection="per-layer"` keeps the top n of each layer (n * len(P) kept). Global is the default because the
    scores are in one unit in every layer (log-probability of the answer token), so a global ranking compares
    like with like, and because CNA ranks neurons across layers as one list ("17_5769, 19_1234, ...") with the
    prediction-enhancing neurons concentrated in a few deep layers; an equal budget per layer would keep weak
    neurons of unimportant layers and drop strong ones of important layers. (The abstract does not fix the
    choice; per-layer is there for comparison.) The random control follows the same selection: uniformly over
    all neurons of P (global) or n per layer (per-layer).

    Random keep sets are nested across keep sizes: repeat r draws one permutation (global, or one per layer)
    from a local `torch.Generator` seeded with `seed`, and keep_rand(n, r) is its first n entries, just as
    keep_top(n) is the first n of the ranking. The same seed gives the same sets; the global RNG is not used.

How it is computed
    The layers below the first pruned layer are the same in every configuration, so one intact pass records the
    residual entering it (`models/from_layer.layer_inputs`) and every configuration runs from there on
    (`run_from_layers`); with the last half pruned, each configuration costs half a forward pass.

Shapes
    scores           [len(layers), d_mlp]
    PruningResult    top_accuracy / top_prob [size]; random_accuracy / random_prob [size, repeat]

Usage
    >>> scores = cna_scores(...).mean(0)                                  # [layer, d_mlp] for layers 15..29
    >>> result = pruning_sweep(view, ids, mask, end, answers, scores, layers=range(15, 30),
    ...                        keep_sizes=[0, 100, 300, 1000], n_random=5)
    >>> result.rows()                                                     # one dict per keep size, for a CSV

References: Yu & Ananiadou, "Interpreting Arithmetic Mechanism in Large Language Models through Comparative
Neuron Analysis", EMNLP 2024 (arXiv 2409.14144), applications (model pruning); METHODS.md sec. 6.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from arithmech.errors import ConfigError
from arithmech.models.from_layer import JoiningRows, layer_inputs, run_from_layers
from arithmech.models.predictions import EndPredictions, predict_at_end, read_predictions
from arithmech.models.view import ModelView
from arithmech.neurons.coefficients import d_mlp, mask_neurons

Selection = Literal["global", "per-layer"]
SELECTIONS: tuple[str, ...] = ("global", "per-layer")

KeepSets = dict[int, torch.Tensor]
"""{layer: long tensor of the kept neuron indices, sorted}."""


@dataclass(frozen=True)
class PruningResult:
    """Accuracy and mean answer probability after keeping the top-scored vs random neurons of `layers`."""

    layers: tuple[int, ...]
    selection: Selection
    keep_sizes: tuple[int, ...]
    n_neurons: int
    """Neurons in the pruned layers together (len(layers) * d_mlp)."""
    seed: int
    baseline_accuracy: float
    baseline_prob: float
    top_accuracy: torch.Tensor  # [size]
    top_prob: torch.Tensor  # [size]
    random_accuracy: torch.Tensor  # [size, repeat]
    random_prob: torch.Tensor  # [size, repeat]

    def n_kept(self, keep: int) -> int:
        """Neurons kept over all pruned layers for one keep size."""
        return keep if self.selection == "global" else keep * len(self.layers)

    def rows(self) -> list[dict[str, Any]]:
        """One row per keep size: top-scored numbers, and mean and sd of the random repeats (NaN sd if < 2)."""
        out = []
        for i, keep in enumerate(self.keep_sizes):
            acc, prob = self.random_accuracy[i], self.random_prob[i]
            out.append(
                {
                    "keep": keep,
                    "n_kept": self.n_kept(keep),
                    "fraction_kept": self.n_kept(keep) / self.n_neurons,
                    "top_accuracy": float(self.top_accuracy[i]),
                    "top_prob": float(self.top_prob[i]),
                    "random_accuracy_mean": _mean(acc),
                    "random_accuracy_sd": _sd(acc),
                    "random_prob_mean": _mean(prob),
                    "random_prob_sd": _sd(prob),
                    "baseline_accuracy": self.baseline_accuracy,
                    "baseline_prob": self.baseline_prob,
                }
            )
        return out


def top_keep_sets(scores: torch.Tensor, layers: Sequence[int], keep: int, selection: Selection = "global") -> KeepSets:
    """The `keep` highest-scored neurons, overall (global) or of each layer (per-layer); ties keep the lower index."""
    layers = tuple(layers)
    _check_scores(scores, layers)
    scores = scores.detach().cpu()
    n_layers, width = scores.shape
    _check_keep(keep, selection, n_layers, width)
    if selection == "per-layer":
        order = torch.argsort(scores, dim=1, descending=True, stable=True)  # [layer, d_mlp]
        return {layer: order[i, :keep].sort().values for i, layer in enumerate(layers)}
    flat = torch.argsort(scores.reshape(-1), descending=True, stable=True)[:keep]  # [keep] into layer * d_mlp
    return _split_flat(flat, layers, width)


def random_keep_sets(
    layers: Sequence[int], width: int, keep_sizes: Sequence[int], selection: Selection, generator: torch.Generator
) -> list[KeepSets]:
    """One random keep set per keep size, nested (each a prefix of one permutation drawn from `generator`)."""
    layers = tuple(layers)
    if selection == "per-layer":
        perms = [torch.randperm(width, generator=generator) for _ in layers]  # len(layers) x [d_mlp]
        return [{layer: perms[i][:k].sort().values for i, layer in enumerate(layers)} for k in keep_sizes]
    perm = torch.randperm(len(layers) * width, generator=generator)  # [layer * d_mlp]
    return [_split_flat(perm[:k], layers, width) for k in keep_sizes]


@torch.no_grad()
def pruned_predictions(
    view: ModelView,
    ids: torch.Tensor,
    mask: torch.Tensor,
    end: torch.Tensor,
    answer_ids: torch.Tensor,
    keep: KeepSets,
    batch_size: int = 32,
) -> EndPredictions:
    """END predictions with every neuron of each layer in `keep` masked to zero except the kept ones."""
    with mask_neurons(view, keep):
        return predict_at_end(view, ids, mask, end, answer_ids, batch_size)


@torch.no_grad()
def pruning_sweep(
    view: ModelView,
    ids: torch.Tensor,
    mask: torch.Tensor,
    end: torch.Tensor,
    answer_ids: torch.Tensor,
    scores: torch.Tensor,
    layers: Sequence[int],
    keep_sizes: Sequence[int],
    *,
    selection: Selection = "global",
    n_random: int = 5,
    seed: int = 0,
    batch_size: int = 32,
    progress: Callable[[int], None] | None = None,
) -> PruningResult:
    """Keep the top-scored and `n_random` random sets of each size in `keep_sizes`; score each on the prompts.

    ids/mask: right-padded prompts [row, pos]; end: [row] last real token; answer_ids: [row]; scores:
    [len(layers), d_mlp], aligned with `layers`. `progress` is called with 1 after each configuration.
    """
    layers = tuple(int(layer) for layer in layers)
    keep_sizes = tuple(int(k) for k in keep_sizes)
    if selection not in SELECTIONS:
        raise ConfigError(f"selection {selection!r} is not one of {', '.join(SELECTIONS)}")
    if not keep_sizes:
        raise ConfigError("keep_sizes is empty; give at least one number of neurons to keep")
    if n_random < 0:
        raise ConfigError(f"n_random must be 0 or more (got {n_random})")
    _check_scores(scores, layers)
    width = int(scores.shape[1])
    for layer in layers:
        if d_mlp(view, layer) != width:
            raise ConfigError(f"scores have {width} neurons per layer but layer {layer} has {d_mlp(view, layer)}")
    for k in keep_sizes:
        _check_keep(k, selection, len(layers), width)

    start, n_layers = min(layers), view.dims.n_layers  # every configuration starts there, from the intact pass
    chunks = []
    for lo in range(0, len(end), batch_size):
        rows = slice(lo, lo + batch_size)
        span = int(end[rows].max()) + 1
        intact = layer_inputs(view, ids[rows, :span], mask[rows, :span], [start, n_layers])  # [prompt, pos, d]
        joining = JoiningRows(torch.arange(len(intact[start])), torch.full((len(intact[start]),), start), intact[start])
        chunks.append((rows, span, joining, intact[n_layers]))

    def run(keep: KeepSets) -> tuple[float, float]:
        at_end = []
        with mask_neurons(view, keep):
            for rows, span, joining, final in chunks:
                if keep:  # nothing pruned: the intact pass's own final residual
                    final = run_from_layers(view, joining, ids[rows, :span], mask[rows, :span])  # [prompt, pos, d]
                at_end.append(view.vocab_logits(final[torch.arange(len(final)), end[rows]]).float())
        pred = read_predictions(at_end, answer_ids)
        if progress is not None:
            progress(1)
        return float(pred.correct.float().mean()), float(pred.answer_prob.mean())

    baseline = run({})
    top = [run(top_keep_sets(scores, layers, k, selection)) for k in keep_sizes]
    generator = torch.Generator().manual_seed(seed)
    rand = torch.zeros(len(keep_sizes), n_random, 2)
    for r in range(n_random):
        for i, keep in enumerate(random_keep_sets(layers, width, keep_sizes, selection, generator)):
            rand[i, r] = torch.tensor(run(keep))
    top_t = torch.tensor(top, dtype=torch.float32).reshape(len(keep_sizes), 2)  # [size, (accuracy, prob)]
    return PruningResult(
        layers=layers,
        selection=selection,
        keep_sizes=keep_sizes,
        n_neurons=len(layers) * width,
        seed=seed,
        baseline_accuracy=baseline[0],
        baseline_prob=baseline[1],
        top_accuracy=top_t[:, 0],
        top_prob=top_t[:, 1],
        random_accuracy=rand[..., 0],
        random_prob=rand[..., 1],
    )


# -- internals ----------------------------------------------------------------------------------------------
def _split_flat(flat: torch.Tensor, layers: tuple[int, ...], width: int) -> KeepSets:
    """Indices into the flattened [layer, d_mlp] grid -> {layer: sorted neuron indices}."""
    row, neuron = flat // width, flat % width
    return {layer: neuron[row == i].sort().values for i, layer in enumerate(layers)}


def _check_scores(scores: torch.Tensor, layers: tuple[int, ...]) -> None:
    if scores.dim() != 2 or scores.shape[0] != len(layers):
        raise ConfigError(
            f"scores must be [len(layers)={len(layers)}, d_mlp], one row per pruned layer (got {tuple(scores.shape)})"
        )
    if len(set(layers)) != len(layers):
        raise ConfigError(f"layers {list(layers)} repeat a layer; list each pruned layer once")
    if torch.isnan(scores).any():
        raise ConfigError("scores contain NaN; compute them on prompts where every score is defined")


def _check_keep(keep: int, selection: Selection, n_layers: int, width: int) -> None:
    most = n_layers * width if selection == "global" else width
    if not 0 <= keep <= most:
        unit = "in all pruned layers" if selection == "global" else "per layer"
        raise ConfigError(f"keep size {keep} is not in 0..{most}, the number of neurons {unit}")


def _mean(x: torch.Tensor) -> float:
    return float(x.mean()) if x.numel() else math.nan


def _sd(x: torch.Tensor) -> float:
    return float(x.std()) if x.numel() > 1 else math.nan
