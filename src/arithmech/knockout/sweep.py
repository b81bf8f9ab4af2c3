"""Effect-rank vs random-rank knockout curves (Zhang et al. 2024, section 4.1, Figure 3).

Knock out the top-k components by path-patching effect (most negative first) and, as the control, k
components drawn at random from the same pool with several seeds, for k = 1, 2, 4, ... up to `max_k`: as many
heads and as many MLPs as the top k hold (`draw_like`), so that the control removes the same kinds;
record accuracy (answer still the top token) and mean answer probability on the reference set. If the
ranking is faithful, effect-ranked knockouts hurt far more than random ones (the paper: ~70% accuracy drop vs
within 2%). All configurations run through `batched.knockout_scores`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from arithmech.data.carries import place_group_masks
from arithmech.errors import ConfigError
from arithmech.knockout import configurations
from arithmech.knockout.ablation import AblationSources
from arithmech.knockout.batched import KnockoutScores, knockout_scores
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch


def draw_like(chosen: Sequence[Component], pool: Sequence[Component], seed: str) -> list[Component]:
    """A random control for `chosen`: as many heads and as many MLPs as it holds, drawn from those of `pool`
    (`configurations.draw_like`, which the planner shares)."""
    return configurations.draw_like(chosen, pool, seed, _is_head)


def _is_head(component: Component) -> bool:
    return component.head is not None


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation (ddof 1) of the random draws' scores; NaN for fewer than two draws."""
    return statistics.stdev(values) if len(values) > 1 else math.nan


@dataclass(frozen=True)
class SweepRow:
    """One knocked-out configuration and what the model kept."""

    k: int
    ranking: str  # "none", "effect" or "random"
    seed: int | None
    components: tuple[str, ...]
    accuracy: float
    mean_prob: float
    by_place: tuple[tuple[int | None, str, int, float, float], ...] = ()
    """With answers scored token by token (`AnswerRows`): (answer place, group, prompts, accuracy, mean_prob)
    for whole answers (place None), then per place 0 (units), 1 (tens), ... (teacher forced, `data/places.py`),
    per group "all" and each carry group; then accuracy and mean_prob are of whole answers
    (`KnockoutScores.whole_answers`)."""
    prompt_set: str = ""
    """Which prompts were scored, set by the knockout stage: "held_out", "in_sample" or "unranked"."""


@dataclass(frozen=True)
class AnswerRows:
    """Which answer each prompt row of a sweep scores a token of (`data/tokens.py`, answer digits)."""

    pair_index: torch.Tensor  # [row] the row's pair, 0..P-1, a pair's rows together
    place: torch.Tensor  # [row] place value of the row's answer token: 0 units, 1 tens, ...
    groups: tuple[str | None, ...]  # [row] carry group of the row's pair (`data/carries.py`), None for none

    def rows(self, lo: int, hi: int) -> AnswerRows:
        """Rows lo..hi, which must hold whole pairs; their pairs renumbered from 0."""
        pairs = self.pair_index[lo:hi]
        return AnswerRows(pairs - pairs.min(), self.place[lo:hi], self.groups[lo:hi])

    def cells(self, scores: KnockoutScores) -> dict[tuple[int | None, str], KnockoutScores]:
        """(place, group) -> the scores there: place None for whole answers (per pair), then 0, 1, ... (per
        row), each with group "all" first and then each carry group present (`place_group_masks`)."""
        first = torch.ones_like(self.pair_index, dtype=torch.bool)
        first[1:] = self.pair_index[1:] != self.pair_index[:-1]
        pair_groups = [g for g, f in zip(self.groups, first.tolist(), strict=True) if f]
        whole = scores.whole_answers(self.pair_index)
        everywhere = torch.zeros(len(pair_groups), dtype=torch.long)
        out: dict[tuple[int | None, str], KnockoutScores] = {
            (None, group): whole.at(mask) for (_, group), mask in place_group_masks(everywhere, pair_groups).items()
        }
        out.update({key: scores.at(mask) for key, mask in place_group_masks(self.place, self.groups).items()})
        return out


def knockout_sweep(
    view: ModelView,
    batch: PatchingBatch,
    sources: AblationSources,
    ranked: list[Component],
    pool: list[Component],
    max_k: int,
    n_random: int = 5,
    seed: int = 0,
    batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
    answer_rows: AnswerRows | None = None,
) -> list[SweepRow]:
    """The baseline, then for each k the effect-ranked top-k and `n_random` random k-subsets of `pool` with as
    many heads and MLPs as the top k (`draw_like`).

    answer_rows: for prompts that score an answer token by token, which answer and place each scores; the
    rows are then scored per answer place and carry group, and as whole answers.
    """
    if max_k > len(pool):
        raise ConfigError(f"max_k={max_k} is larger than the {len(pool)} components to choose from; lower --max-k")
    if max_k > len(ranked):
        raise ConfigError(f"max_k={max_k} is larger than the {len(ranked)} ranked components; lower --max-k")
    swept = configurations.sweep_configurations(ranked, pool, max_k, n_random, seed, _is_head)
    labels, configs = [label for label, _ in swept], [config for _, config in swept]
    scores = knockout_scores(view, batch, sources, configs, batch_size, progress)
    by_place: list[tuple[tuple[int | None, str, int, float, float], ...]] = [()] * len(configs)
    if answer_rows is not None:
        cells = [(p, g, c.correct.shape[1], c.accuracy.tolist(), c.mean_prob.tolist())
                 for (p, g), c in answer_rows.cells(scores).items()]  # fmt: skip
        by_place = [tuple((p, g, n, acc[i], prob[i]) for p, g, n, acc, prob in cells) for i in range(len(configs))]
        scores = scores.whole_answers(answer_rows.pair_index)
    return [
        SweepRow(k, ranking, s, tuple(c.name for c in config), float(acc), float(prob), places)
        for (k, ranking, s), config, acc, prob, places in zip(
            labels, configs, scores.accuracy.tolist(), scores.mean_prob.tolist(), by_place, strict=True
        )
    ]
