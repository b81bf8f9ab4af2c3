"""Many knockout configurations in batched forward passes.

A configuration is a set of components to ablate. Rows of one forward pass are (configuration, prompt)
pairs; per layer, a boolean mask [row, head] (and [row] for the MLP) says which rows ablate what, and one
hook per layer puts the ablation source in place with `torch.where`, so rows that ablate nothing keep their
exact values. This replaces one forward pass per configuration by one per `batch_size` rows.

The layers below a configuration's lowest ablated layer cannot change, so its rows join the pass there, from
the intact residual of their prompt (`models/from_layer.run_from_layers`); one intact pass per chunk of prompts
records the residuals, and a configuration that ablates nothing is read from it. For single-component
configurations (a head-importance scan) that halves the work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from arithmech.knockout.ablation import AblationSources, ablation_hooks, config_masks
from arithmech.models.from_layer import JoiningRows, layer_inputs, run_from_layers
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

    def whole_answers(self, pair_index: torch.Tensor) -> KnockoutScores:
        """Scores per pair [config, pair] of prompts scored token by token (`pair_index` [prompt] their pair):
        correct when every token is, with the answer's probability the product of its tokens' (teacher forced,
        so greedy decoding writes the whole answer exactly when it is correct)."""
        n_pairs = int(pair_index.max()) + 1
        wrong = torch.zeros(len(self.correct), n_pairs).index_add_(1, pair_index, (~self.correct).float())
        log_prob = torch.zeros(len(self.correct), n_pairs, dtype=torch.float64)
        log_prob.index_add_(1, pair_index, self.answer_prob.double().log())
        return KnockoutScores(wrong == 0, log_prob.exp().float())

    def at(self, prompts: torch.Tensor) -> KnockoutScores:
        """The scores of some prompts ([prompt] bool or indices)."""
        return KnockoutScores(self.correct[:, prompts], self.answer_prob[:, prompts])


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
    n_layers = view.dims.n_layers
    ablates = torch.cat([head_masks.any(-1), mlp_masks], dim=1)  # [config, 2 * layer]: heads then MLP per layer
    layer_of = torch.arange(n_layers).repeat(2)
    first = torch.where(ablates, layer_of, n_layers).amin(1)  # [config] lowest ablated layer (n_layers: none)
    correct = torch.zeros(len(configs), len(batch), dtype=torch.bool)
    prob = torch.zeros(len(configs), len(batch))
    per_chunk = max(1, batch_size // len(configs))  # prompts whose rows share one intact pass
    for lo in range(0, len(batch), per_chunk):
        prompts = torch.arange(lo, min(lo + per_chunk, len(batch)))
        width = int(batch.end[prompts].max()) + 1
        ids, mask = batch.ref_ids[prompts, :width], batch.ref_mask[prompts, :width]
        intact = layer_inputs(view, ids, mask, sorted(set(first.tolist())))  # layer -> [prompt, pos, d_model]
        rows = torch.cartesian_prod(torch.arange(len(configs)), torch.arange(len(prompts)))  # [(config, local)]
        rows = rows[first[rows[:, 0]].argsort(stable=True)]  # rows join the pass by layer
        for start in range(0, len(rows), batch_size):
            config, local = rows[start : start + batch_size].unbind(1)
            prompt = prompts[local]
            start_resid = [intact[int(f)][i] for f, i in zip(first[config], local, strict=True)]
            joining = JoiningRows(local, first[config], torch.stack(start_resid))  # [row, pos, d_model]
            with hooks(**ablation_hooks(view, head_masks, mlp_masks, sources, config, prompt)):
                final = run_from_layers(view, joining, ids, attention_mask=mask)  # [row, pos, d_model]
            at_end = view.vocab_logits(final[torch.arange(len(prompt)), batch.end[prompt].to(final.device)]).float()
            answers = batch.answer_ids[prompt].to(at_end.device)
            correct[config, prompt] = (at_end.argmax(-1) == answers).cpu()
            prob[config, prompt] = at_end.softmax(-1).gather(1, answers[:, None])[:, 0].cpu()
            if progress is not None:
                progress(len(prompt))
    return KnockoutScores(correct, prob)

