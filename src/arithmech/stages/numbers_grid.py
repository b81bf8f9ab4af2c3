"""The numbers stage's passes over its prompt grid before any patching: which prompts the model answers, the
mean activation per operand value at every site and layer, and the corrupted partners each site patches.

Steps 1 and the first half of 3 of `stages/numbers.py`: one forward pass of the prompt set (with its answer, so
that "answered correctly" is every answer token's argmax) reads the residual entering every chosen layer at every
site; the correct prompts are averaged per value of the site's operand. Each site then takes up to max_prompts
correct prompts (in a seeded order) whose corrupted partner (`data/number_grid.partner`) the model also answers.
The work is counted in token-layers (`TokenLayers`), the engine's unit (`patching/subspace.row_cost`).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from arithmech.data.number_grid import NumberGrid, Partner, Site, partner
from arithmech.models.from_layer import layer_inputs
from arithmech.models.view import ModelView
from arithmech.stages.numbers_config import NumbersConfig


def pad_ids(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask [prompt, pos]."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids, mask


LastToken = dict[int, torch.Tensor]
"""prompt index -> its last token's residual [layer, d_model] (float32)."""


class TokenLayers:
    """Token-layers run by the stage, per part ("grid", "partners", "bases", "rows", ...), in the engine's units
    (`patching/subspace.row_cost`); a forward pass of a prompt is n_layers x its tokens."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers, self.parts = n_layers, {"grid": 0, "partners": 0, "bases": 0, "rows": 0}

    def forward(self, part: str, mask: torch.Tensor) -> None:
        """Count a whole forward pass of the prompts of `mask` [prompt, pos]."""
        self.parts[part] = self.parts.get(part, 0) + int(mask.sum()) * self.n_layers

    def add(self, part: str, token_layers: int) -> None:
        self.parts[part] = self.parts.get(part, 0) + token_layers


@torch.no_grad()
def grid_means(view: ModelView, grid: NumberGrid, layers: list[int], sites: list[Site], positions: dict[str, int],
               pad: int, batch_size: int, cost: TokenLayers, only_correct: bool,
               keep_last: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor], LastToken]:  # fmt: skip
    """(correct [prompt] bool, site -> means [value, layer, d_model] float64 over the prompts of each value, the
    correct ones only when `only_correct`, NaN where a value has none; with `keep_last`, prompt index -> its last
    token's residual [layer, d_model] (float32) for those same prompts, the Clock's rows)."""
    n_values, d = grid.high - grid.low, view.dims.d_model
    sums = {s.name: torch.zeros(n_values, len(layers), d, dtype=torch.float64) for s in sites}
    counts = {s.name: torch.zeros(n_values, dtype=torch.float64) for s in sites}
    correct, last = [], LastToken()
    for start in range(0, len(grid.prompts), batch_size):
        chunk = grid.prompts[start : start + batch_size]
        ids, mask = pad_ids([p.ids + p.answer for p in chunk], pad)
        cost.forward("grid", mask)
        states = layer_inputs(view, ids, mask, [*layers, view.dims.n_layers])
        final = states[view.dims.n_layers]  # [prompt, pos, d_model]
        for i, p in enumerate(chunk):
            at = torch.arange(len(p.ids) - 1, len(p.ids) - 1 + len(p.answer))
            top = view.vocab_logits(final[i, at.to(final.device)]).argmax(-1).cpu()
            ok = bool((top == torch.tensor(p.answer)).all())
            correct.append(ok)
            if only_correct and not ok:
                continue
            if keep_last:
                at = p.positions["last"]
                last[start + i] = torch.stack([states[layer][i, at] for layer in layers]).float().cpu()
            for s in sites:
                value = (p.a if s.operand == "a" else p.b) - grid.low
                pos = positions[s.name] if s.token != "last" else p.positions["last"]
                sums[s.name][value] += torch.stack([states[layer][i, pos] for layer in layers]).double().cpu()
                counts[s.name][value] += 1
    means = {name: sums[name] / counts[name][:, None, None] for name in sums}  # NaN where a value has no prompt
    return torch.tensor(correct), means, last


@torch.no_grad()
def find_partners(view: ModelView, tokenizer: Any, grid: NumberGrid, site: Site, kept: list[int],
                  cfg: NumbersConfig, pad: int, cost: TokenLayers) -> list[tuple[int, Partner]]:  # fmt: skip
    """Up to max_prompts (prompt index, partner) whose corrupted prompt the model answers (when filtering)."""
    order = list(kept)
    random.Random(f"{cfg.seed}:numbers-order:{site.name}").shuffle(order)
    found: list[tuple[int, Partner]] = []
    for start in range(0, len(order), cfg.batch_size):
        found_here = [(i, partner(tokenizer, grid, grid.prompts[i], site, cfg.seed))
                      for i in order[start : start + cfg.batch_size]]  # fmt: skip
        chunk = [(i, p) for i, p in found_here if p is not None]
        if not chunk:
            continue
        if cfg.filter_correct:
            ids, mask = pad_ids([p.ids for _, p in chunk], pad)
            cost.forward("partners", mask)
            end = mask.sum(1) - 1
            top = view.end_logits(ids, mask, end).argmax(-1).cpu()
            chunk = [(i, p) for (i, p), t in zip(chunk, top.tolist(), strict=True) if t == p.bad]
        found += chunk
        if len(found) >= cfg.max_prompts:
            break
    return found[: cfg.max_prompts]
