"""END-only knockout of prompts that share a long prefix (few-shot word problems): the prefix runs once.

Background
    A 3-shot word-problem prompt is mostly solved examples, the same for every prompt of a set. A causal
    model's states on those tokens do not depend on what follows, and an ablation placed at END only cannot
    reach them either. So the shared prefix runs once and each prompt's own tokens (the suffix) run batched,
    right-padded, on its cache (`models/shared_prefix.py`). The END logits are those of the whole prompt up to
    float rounding (`tests/unit/knockout/test_end_only.py` checks this against `predict_at_end` and
    `knockout_scores`). For SmolLM2 on SVAMP/GSM8K this runs ~60-100 tokens per (configuration, prompt)
    instead of ~300.

Shapes
    prefix ids [1, P] (P = `common_prefix_length`; 0 runs whole prompts); suffix ids and mask [rows, S]
    (prompt positions P..);
    END in suffix coordinates = end - P; END values per layer [batch, head * d_head] and [batch, d_model].

END-only knockout
    For configuration c and prompt i, the o_proj input of every head that c ablates (and the MLP output of
    every MLP it ablates) is replaced at END by `values[i]`, as `knockout.ablation` does with END-only
    sources, through the END-value hooks (`models/end_value.py`) on the suffix pass.

Usage
    >>> p = common_prefix_length(batch.ref_ids, batch.end)
    >>> predictions, values = end_states(view, batch, p)
    >>> scores = end_knockout_scores(view, batch, values.mean(), configs, p)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from arithmech.knockout.ablation import config_masks
from arithmech.knockout.batched import KnockoutScores
from arithmech.models.end_value import input_at_end, output_at_end
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.predictions import EndPredictions
from arithmech.models.shared_prefix import SharedPrefix
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch


@dataclass(frozen=True)
class EndValues:
    """Per layer, one END value per prompt: o_proj inputs [batch, H*dh] and MLP outputs [batch, d_model]."""

    z: list[torch.Tensor]
    mlp: list[torch.Tensor]

    def take(self, rows: torch.Tensor | list[int]) -> EndValues:
        """The values of some prompts, in that order."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        return EndValues([t[idx] for t in self.z], [t[idx] for t in self.mlp])

    def mean(self) -> EndValues:
        """Every prompt gets the mean END value over all prompts ("mean over the data set")."""
        return EndValues([t.mean(0, keepdim=True).expand_as(t) for t in self.z],
                         [t.mean(0, keepdim=True).expand_as(t) for t in self.mlp])

    def zeros(self) -> EndValues:
        return EndValues([torch.zeros_like(t) for t in self.z], [torch.zeros_like(t) for t in self.mlp])


class _Prefix:
    """The shared prefix of a batch (`models/shared_prefix.py`), and the END logits of some of its prompts."""

    def __init__(self, view: ModelView, batch: PatchingBatch, prefix_len: int) -> None:
        self.view, self.batch, self.p = view, batch, prefix_len
        self.shared = SharedPrefix.of_tokens(view, batch.ref_ids[0, :prefix_len])

    def logits(self, prompts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits at END [rows, d_vocab] of `prompts` (indices into the batch), and END in suffix coordinates."""
        end = self.batch.end[prompts] - self.p  # [rows]
        width = int(end.max()) + 1
        columns = slice(self.p, self.p + width)
        resid = self.shared.final_resid(self.batch.ref_ids[prompts, columns], self.batch.ref_mask[prompts, columns])
        rows = torch.arange(len(prompts), device=resid.device)
        return self.view.vocab_logits(resid[rows, end.to(resid.device)]).float(), end  # as `ModelView.end_logits`


@torch.no_grad()
def end_states(
    view: ModelView, batch: PatchingBatch, prefix_len: int, batch_size: int = 32
) -> tuple[EndPredictions, EndValues]:
    """Top token and answer probability at END, and every layer's END values, of each prompt of `batch`."""
    prefix = _Prefix(view, batch, prefix_len)
    n_layers = view.dims.n_layers
    z: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
    mlp: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
    tops, probs, logits_out = [], [], []
    for start in range(0, len(batch), batch_size):
        prompts = torch.arange(start, min(start + batch_size, len(batch)))
        end = batch.end[prompts] - prefix_len
        with hooks(
            pre=[(view.o_proj(layer), _save_end(z[layer], end, True)) for layer in range(n_layers)],
            post=[(view.mlp(layer), _save_end(mlp[layer], end, False)) for layer in range(n_layers)],
        ):
            at_end, _ = prefix.logits(prompts)
        answers = batch.answer_ids[prompts].to(at_end.device)
        tops.append(at_end.argmax(-1).cpu())
        probs.append(at_end.softmax(-1).gather(1, answers[:, None])[:, 0].cpu())
        logits_out.append(at_end.gather(1, answers[:, None])[:, 0].cpu())
    top = torch.cat(tops)
    predictions = EndPredictions(top, torch.cat(probs), torch.cat(logits_out), top == batch.answer_ids.cpu())
    return predictions, EndValues([torch.cat(t) for t in z], [torch.cat(t) for t in mlp])


@torch.no_grad()
def end_knockout_scores(
    view: ModelView,
    batch: PatchingBatch,
    values: EndValues,
    configs: list[list[Component]],
    prefix_len: int,
    batch_size: int = 32,
) -> KnockoutScores:
    """Like `knockout_scores` with END-only sources `values`, running only the suffixes."""
    prefix = _Prefix(view, batch, prefix_len)
    head_masks, mlp_masks = config_masks(view, configs)
    rows = torch.cartesian_prod(torch.arange(len(configs)), torch.arange(len(batch)))  # [(config, prompt)]
    correct = torch.zeros(len(configs), len(batch), dtype=torch.bool)
    prob = torch.zeros(len(configs), len(batch))
    for start in range(0, len(rows), batch_size):
        block = rows[start : start + batch_size]
        config, prompt = block[:, 0], block[:, 1]
        end = batch.end[prompt] - prefix_len
        pre, post = [], []
        for layer in range(view.dims.n_layers):
            row_heads = head_masks[config, layer]  # [row, head]
            if row_heads.any():
                columns = row_heads.repeat_interleave(view.dims.d_head, dim=1)  # [row, head * d_head]
                pre.append((view.o_proj(layer), input_at_end(columns, values.z[layer][prompt], end)))
            row_mlp = mlp_masks[config, layer]  # [row]
            if row_mlp.any():
                post.append((view.mlp(layer), output_at_end(row_mlp[:, None], values.mlp[layer][prompt], end)))
        with hooks(pre=pre, post=post):
            at_end, _ = prefix.logits(prompt)
        answers = batch.answer_ids[prompt].to(at_end.device)
        correct[config, prompt] = (at_end.argmax(-1) == answers).cpu()
        prob[config, prompt] = at_end.softmax(-1).gather(1, answers[:, None])[:, 0].cpu()
    return KnockoutScores(correct, prob)


def _save_end(store: list[torch.Tensor], end: torch.Tensor, pre: bool) -> Callable[..., None]:
    """A hook appending the END rows [rows, width] of an o_proj input (pre) or an MLP output to `store`."""

    def fn(_m: Any, args: Any, out: Any = None) -> None:
        value = args[0] if pre else first_tensor(out)  # [rows, S, width]
        store.append(value[torch.arange(len(end)), end.to(value.device)].detach().cpu())

    return fn
