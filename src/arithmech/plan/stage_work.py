"""The work of the stages that call the knockout engine on prompt sets of their own: transfer and neurons.

transfer (stages/transfer_config.target_cost, used by the stage's own batching): per target, the candidates'
    filtering run, the ablation values' run and the knockout of the kept prompts over the configurations:
    nothing, each source's effect-ranked top k (a ranking read from an identify run is not known here, so at
    layer 0: an upper bound) and the random draws (`knockout/configurations.draw_like`, seeded as the stage
    draws them; the same for every source of one k, so scored once). k is --k, else K_CAP (a source's key
    components are at most K_CAP). Generated targets have as many candidates as `build_target_pairs` makes;
    word problems `limit` rows at WORD_TOKENS tokens, their END-only knockout planned as full rows (an upper
    bound: the stage runs their shared solved examples once). A prompt is one row (a multi-token answer adds a
    teacher-forced row per further token).
neurons (neurons/importance.head_importance): per operation, the prediction run and `knockout_cost` of the
    intact configuration and each head zeroed alone (zero ablation needs no values run). Its later steps
    (comparative neurons, pruning, LoRA) are not counted: the plan marks the stage as partly modelled.
Prompt filtering before a set is built (identify's and neurons' reference sets) is not counted, as for identify.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from arithmech.data.target_sets import build_target_pairs, target_set
from arithmech.knockout import configurations as kc
from arithmech.plan import work as wk
from arithmech.plan.shape import ModelShape
from arithmech.stages.transfer_config import K_CAP, rows_per_pass, target_cost

WORD_TOKENS = 256
"""Tokens planned for a word-problem target's prompt (the evaluate benchmarks' length, plan/planner.py)."""


def transfer_work(shape: ModelShape, cfg: Any, tokens: int) -> tuple[wk.Work, dict[str, Any]]:
    """The transfer stage's work over its targets (module docstring) and the sizes it uses."""
    n_layers = shape.n_layers
    k = min(cfg.k or K_CAP, n_layers * shape.n_heads)
    pool = kc.layer_pool(n_layers, shape.n_heads, cfg.include_mlps)
    ranked = [(0, True)] * k
    draws = [kc.draw_like(ranked, pool, f"{cfg.seed}-{k}-{s}", lambda c: c[1]) for s in range(cfg.n_random)]
    first = [n_layers] + [0] * len(cfg.sources) + [min(layer for layer, _ in d) for d in draws]
    parts: dict[str, tuple[int, int]] = {}
    calls = prompts = 0
    for name in cfg.targets:
        spec = target_set(name)
        word = spec.kind == "word"
        width = WORD_TOKENS if word else tokens
        n = cfg.limit if word else len(build_target_pairs(spec, cfg.target_options()))
        values = not word and cfg.ablation != "zero"
        scored = min(n, cfg.max_prompts)
        cost = target_cost(n_layers, first, [width] * n, [width] * scored, cfg.batch_size, values)
        knock = cost.knockout
        parts[name] = (cost.plain_token_layers + knock.intact_token_layers + knock.row_token_layers,
                       cost.plain_rows + knock.end_rows)  # fmt: skip
        size = rows_per_pass(width, cfg.batch_size)
        calls += math.ceil(n / size) * (2 if values else 1) + math.ceil(knock.end_rows / size)
        prompts += scored
    work = wk.token_layer_work(shape, parts, prompts, tokens, calls, "stages/transfer_config.py target_cost")
    sizes = {
        "configurations": len(first),
        "k": k,
        "rows_per_pass": rows_per_pass(tokens, cfg.batch_size),
        "scored_prompts": prompts,
    }
    return work, sizes


def importance_cost(
    n_layers: int, head_layers: Sequence[int], widths: Sequence[int], batch_size: int
) -> tuple[int, kc.KnockoutCost]:
    """`head_importance` on one operation's prompts of `widths` tokens (END + 1), each head of `head_layers` zeroed
    alone: the prediction run's token-layers (batch_size prompts a call, each padded to its widest; one END row
    a prompt) and the knockout's cost."""
    chunks = [widths[lo : lo + batch_size] for lo in range(0, len(widths), batch_size)]
    predict = sum(len(c) * max(c) for c in chunks) * n_layers
    return predict, kc.knockout_cost(n_layers, [n_layers, *head_layers], widths, batch_size)


def head_importance_work(shape: ModelShape, cfg: Any, tokens: int) -> tuple[wk.Work, dict[str, Any]]:
    """neurons' head importance (module docstring): per operation, max_prompts prompts of `tokens` tokens."""
    n_layers, n = shape.n_layers, cfg.max_prompts
    layers = cfg.importance_layers if cfg.importance_layers is not None else range(n_layers)
    first = [layer for layer in layers for _ in range(shape.n_heads)]
    predict, cost = importance_cost(n_layers, first, [tokens] * n, cfg.batch_size)
    ops = len(cfg.operations)
    token_layers = ops * (predict + cost.intact_token_layers + cost.row_token_layers)
    parts = {"head importance": (token_layers, ops * (n + cost.end_rows))}
    calls = ops * (math.ceil(n / cfg.batch_size) + math.ceil(cost.end_rows / cfg.batch_size))
    work = wk.token_layer_work(shape, parts, ops * n, tokens, calls, "knockout/configurations.py knockout_cost")
    return work, {"configurations": len(first) + 1, "prompts_per_intact_pass": max(1, cfg.batch_size // len(first))}
