"""Runs that continue from a start already run: its keys and values are computed once and reused.

Background
    A causal model's states on a prefix do not depend on what follows. So positions that later rows share
    with a run already made need not run again: the rows' own positions P.. run on the keys and values of
    positions < P of that run. Three cases use this, all through `SharedPrefix`:
    - every row of a batch starts with the same P tokens (a prompt file's few-shot examples; a prompt followed
      by each of its answer tokens): the P tokens run once, at batch size 1 (`SharedPrefix.of_tokens`);
    - a counterfactual prompt agrees with its reference prompt on its first P positions (path patching): the
      counterfactual run continues from the reference run's cache, row by row (`SharedPrefix(view, cache, P)`);
    - an intervention at END only (the heuristic neurons' ablation): each prompt's tokens before END run once
      after the shared prefix (`extended`) and every variant of the prompt runs only its END token on that.
    The states at positions >= P are those of whole rows up to float rounding (`tests/unit/models/
    test_shared_prefix.py`, and the knockout, answer-check and path-patching tests against whole-row runs).

Caches
    The run whose start is shared keeps every position of every layer (`full_cache`), also of sliding-window
    layers, so any prefix length of any of its rows can be taken from it. A continuing row gets the model's own
    cache of that prefix (`prefix_cache`): built as the model would build it on those positions (a
    sliding-window layer keeps its window), so the masks the model makes from it fit. The total-effect and
    mediation engines take it directly, at each position they patch (`patching/total.py`, `patching/mediation.py`).

Usage
    >>> p = common_prefix_length(ids, end)                           # ids [rows, pos], right-padded
    >>> prefix = SharedPrefix.of_tokens(view, ids[0, :p])
    >>> resid = prefix.final_resid(ids[:, p:], mask[:, p:])          # [rows, pos - p, d_model] entering the final norm
    >>> past = SharedPrefix(view, ref_cache, p).past(torch.arange(n)) # continue each of the n rows of a full_cache run
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache

from arithmech.models.view import ModelView, cache_kwarg


def full_cache() -> DynamicCache:
    """An empty cache that keeps every position of every layer, also of sliding-window layers.

    Given to a reference pass, it holds the keys/values of any prefix, of any of its prompts, at any length.
    """
    return DynamicCache()


def prefix_cache(view: ModelView, cache: Cache, prompts: torch.Tensor, length: int) -> DynamicCache:
    """The model's own cache of positions < `length` of some prompts [row], indexed out of a `full_cache` run.

    Built as the model would build it on those positions (sliding-window layers keep their window), so the
    masks the model makes from it fit.
    """
    return _copy_rows(DynamicCache(config=view.model.config), cache, prompts, length)


def _copy_rows(into: DynamicCache, cache: Cache, rows: torch.Tensor, length: int) -> DynamicCache:
    """`into`, given positions < length of rows [row] of every layer of `cache`."""
    for layer, kept in enumerate(cache.layers):
        at = rows.to(kept.keys.device)
        into.update(kept.keys[at, :, :length], kept.values[at, :, :length], layer)
    return into


def common_prefix_length(ids: torch.Tensor, end: torch.Tensor) -> int:
    """Tokens that every row [batch, pos] shares at the start, short of the earliest END."""
    limit = int(end.min())  # END itself must stay in every suffix
    differs = (ids[:, :limit] != ids[:1, :limit]).any(dim=0).nonzero()  # [n_differing_positions, 1]
    return int(differs[0, 0]) if len(differs) else limit


class SharedPrefix:
    """The first `length` positions of a run (its `full_cache`, every position kept), for rows that continue
    it; length 0 (cache None): rows run whole."""

    def __init__(self, view: ModelView, cache: Cache | None, length: int) -> None:
        self.view, self.cache, self.length = view, cache if length else None, int(length)
        self.device = view.o_proj(0).weight.device
        self.arg = cache_kwarg(view.model.base_model)

    @classmethod
    @torch.no_grad()
    def of_tokens(cls, view: ModelView, tokens: torch.Tensor) -> SharedPrefix:
        """Tokens [length] that start every row, run once at batch size 1 (nothing runs when empty)."""
        cache = full_cache()
        if len(tokens):
            ids = tokens[None].to(view.o_proj(0).weight.device)  # [1, length]
            view.model.base_model(input_ids=ids, use_cache=True, **{cache_kwarg(view.model.base_model): cache})
        return cls(view, cache, len(tokens))

    def past(self, rows: torch.Tensor) -> DynamicCache | None:
        """The cache of the prefix for new rows, row i continuing row `rows[i]` of the run (None when empty).

        A forward pass given it appends the new positions to it."""
        return None if self.cache is None else prefix_cache(self.view, self.cache, rows, self.length)

    @torch.no_grad()
    def final_resid(self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The residual entering the final norm [row, S, d_model] at the rows' own positions ids [row, S]
        (positions length..; mask [row, S] marks their real tokens); rows [row]: the run's row each continues
        (default: row 0, a prefix run once for all rows)."""
        ids, mask = ids.to(self.device), mask.to(self.device)
        if self.cache is None:
            return self.view.final_resid(input_ids=ids, attention_mask=mask, use_cache=False)
        past = self.past(torch.zeros(len(ids), dtype=torch.long) if rows is None else rows)
        whole_mask = torch.cat([mask.new_ones(len(ids), self.length), mask], dim=1)
        return self.view.final_resid(input_ids=ids, attention_mask=whole_mask, use_cache=True, **{self.arg: past})

    @torch.no_grad()
    def extended(self, ids: torch.Tensor, rows: torch.Tensor) -> SharedPrefix:
        """The prefix followed by ids [row, S] (no padding), row i continuing row `rows[i]`: a new run of
        len(rows) rows whose first length + S positions later rows can continue from."""
        cache = full_cache() if self.cache is None else _copy_rows(full_cache(), self.cache, rows, self.length)
        if ids.shape[1]:
            mask = torch.ones(len(ids), self.length + ids.shape[1], dtype=torch.long, device=self.device)
            self.view.model.base_model(input_ids=ids.to(self.device), attention_mask=mask, use_cache=True,
                                       **{self.arg: cache})  # fmt: skip
        return SharedPrefix(self.view, cache, self.length + int(ids.shape[1]))
