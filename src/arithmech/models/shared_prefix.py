"""Rows that start with the same tokens: the shared start runs once, each row's own tokens on its cache.

Background
    A causal model's states on a prefix do not depend on what follows. When every row of a batch starts with
    the same P tokens (a prompt file's few-shot word problems; the answer tokens of one prompt scored one by
    one), those P positions run once, at batch size 1, with their keys and values kept (`full_cache`), and the
    rows' own positions P.. run batched on that cache indexed out for every row (`prefix_cache`). The states
    at positions >= P are those of whole rows up to float rounding (`tests/unit/analysis/test_shared_prefix.py`
    and `tests/unit/data/test_answer_check.py` check it against whole-row runs).

Users: the END-only knockout of word problems (`analysis/shared_prefix.py`) and the reference set's answer check
(`models/predictions.top_tokens_at`).

Usage
    >>> p = common_prefix_length(ids, end)          # ids [rows, pos], right-padded
    >>> prefix = SharedPrefix(view, ids[0, :p])
    >>> resid = prefix.final_resid(ids[:, p:], mask[:, p:])  # [rows, pos - p, d_model] entering the final norm
"""

from __future__ import annotations

import torch

from arithmech.models.from_layer import full_cache, prefix_cache
from arithmech.models.view import ModelView, cache_kwarg


def common_prefix_length(ids: torch.Tensor, end: torch.Tensor) -> int:
    """Tokens that every row [batch, pos] shares at the start, short of the earliest END."""
    limit = int(end.min())  # END itself must stay in every suffix
    differs = (ids[:, :limit] != ids[:1, :limit]).any(dim=0).nonzero()  # [n_differing_positions, 1]
    return int(differs[0, 0]) if len(differs) else limit


class SharedPrefix:
    """The key/value cache of tokens that start every row (run once at construction); empty: whole rows."""

    def __init__(self, view: ModelView, tokens: torch.Tensor) -> None:
        self.view, self.length = view, int(tokens.shape[0])
        self.device = view.o_proj(0).weight.device
        self.arg = cache_kwarg(view.model.base_model)
        self.cache = None
        if self.length:
            self.cache = full_cache()
            with torch.no_grad():
                ids = tokens[None].to(self.device)  # [1, length]
                view.model.base_model(input_ids=ids, use_cache=True, **{self.arg: self.cache})

    @torch.no_grad()
    def final_resid(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The residual entering the final norm [rows, S, d_model] at the rows' own positions ids [rows, S]
        (positions length..; mask [rows, S] marks their real tokens)."""
        ids, mask = ids.to(self.device), mask.to(self.device)
        if self.cache is None:
            return self.view.final_resid(input_ids=ids, attention_mask=mask, use_cache=False)
        rows = len(ids)
        past = prefix_cache(self.view, self.cache, torch.zeros(rows, dtype=torch.long), self.length)
        whole_mask = torch.cat([mask.new_ones(rows, self.length), mask], dim=1)
        return self.view.final_resid(input_ids=ids, attention_mask=whole_mask, use_cache=True, **{self.arg: past})
