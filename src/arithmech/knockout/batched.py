"""Many knockout configurations in batched forward passes.

A configuration is a set of components to ablate. Rows of one forward pass are (configuration, prompt)
pairs; per layer, a boolean mask [row, head] (and [row] for the MLP) says which rows ablate what, and one
hook per layer puts the ablation source in place with `torch.where`, so rows that ablate nothing keep their
exact values. This replaces one forward pass per configuration by one per `batch_size` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from arithmech.knockout.ablation import AblationSources, ablation_hooks, config_masks
from arithmech.models.hooks import hooks
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch


@dataclass(frozen=True)
class KnockoutScores:
    """Per configuration and prompt: is the answer still the top token, and its probability."""

    correct: torch.Tensor  # [config, batch] bool
    answer_prob: torch.Tensor  # [config, batch]

    @property
    def accuracy(self) -> torch.Tensor:
        """[config] fraction of prompts still answered."""
        return self.correct.float().mean(dim=1)

    @property
    def mean_prob(self) -> torch.Tensor:
        """[config] mean probability of the answer token."""
        return self.answer_prob.mean(dim=1)


@torch.no_grad()
def knockout_scores(
    view: ModelView,
    batch: PatchingBatch,
    sources: AblationSources,
    configs: list[list[Component]],
    batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> KnockoutScores:
    """Accuracy and answer probability of every configuration on every prompt of `batch`."""
    head_masks, mlp_masks = config_masks(view, configs)
    n_prompts = len(batch)
    rows = torch.cartesian_prod(torch.arange(len(configs)), torch.arange(n_prompts))  # [(config, prompt)]
    correct = torch.zeros(len(configs), n_prompts, dtype=torch.bool)
    prob = torch.zeros(len(configs), n_prompts)
    for start in range(0, len(rows), batch_size):
        block = rows[start : start + batch_size]
        config, prompt = block[:, 0], block[:, 1]
        width = int(batch.end[prompt].max()) + 1
        with hooks(**ablation_hooks(view, head_masks, mlp_masks, sources, config, prompt)):
            at_end = view.end_logits(batch.ref_ids[prompt, :width], batch.ref_mask[prompt, :width], batch.end[prompt])
        answers = batch.answer_ids[prompt].to(at_end.device)
        correct[config, prompt] = (at_end.argmax(-1) == answers).cpu()
        prob[config, prompt] = at_end.softmax(-1).gather(1, answers[:, None])[:, 0].cpu()
        if progress is not None:
            progress(len(block))
    return KnockoutScores(correct, prob)
