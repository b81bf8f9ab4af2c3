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
neurons (stages/neurons.py): per operation, head importance (neurons/importance.head_importance): the prediction
    run and `knockout_cost` of the intact configuration and each head zeroed alone (zero ablation needs no values
    run); on the first operation's prompts, comparative neurons and attention LI (`comparative_cost`), pruning on
    the held-out and the ranking prompts (`pruning_cost`, the held-out set planned as large), and LoRA's training
    steps and coefficient change (`lora_cost`; the trained layer, when --lora-layer is unset, planned at the first
    deep layer, the longest backward).
Prompt filtering before a set is built (identify's and neurons' reference sets) is not counted, as for identify.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from arithmech.data.target_sets import TargetOptions, build_target_pairs, target_set
from arithmech.knockout import configurations as kc
from arithmech.models.from_layer_cost import joined_token_layers
from arithmech.plan import work as wk
from arithmech.plan.shape import ModelShape
from arithmech.stages.neurons_config import LORA_BATCH
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
        n = cfg.limit if word else generated_pairs(name, cfg.target_options())
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


@functools.cache
def generated_pairs(name: str, options: TargetOptions) -> int:
    """How many prompt pairs a generated target has (generating them takes a while; a budget's bisection over the
    batch size asks again and again)."""
    return len(build_target_pairs(target_set(name), options, log=False))


def importance_cost(
    n_layers: int, head_layers: Sequence[int], widths: Sequence[int], batch_size: int
) -> tuple[int, kc.KnockoutCost]:
    """`head_importance` on one operation's prompts of `widths` tokens (END + 1), each head of `head_layers` zeroed
    alone: the prediction run's token-layers (batch_size prompts a call, each padded to its widest; one END row
    a prompt) and the knockout's cost."""
    chunks = [widths[lo : lo + batch_size] for lo in range(0, len(widths), batch_size)]
    predict = sum(len(c) * max(c) for c in chunks) * n_layers
    return predict, kc.knockout_cost(n_layers, [n_layers, *head_layers], widths, batch_size)


def cna_layers(n_layers: int, cfg: Any) -> tuple[int, ...]:
    """The deep layers of comparative neurons and pruning: --layers, else the last third (stages/neurons.py)."""
    return tuple(cfg.layers) if cfg.layers else tuple(range(n_layers - max(1, n_layers // 3), n_layers))


def neurons_work(shape: ModelShape, cfg: Any, tokens: int) -> tuple[wk.Work, dict[str, Any]]:
    """The neurons stage (module docstring): per operation, max_prompts prompts of `tokens` tokens."""
    n_layers, n = shape.n_layers, cfg.max_prompts
    layers = cfg.importance_layers if cfg.importance_layers is not None else range(n_layers)
    first = [layer for layer in layers for _ in range(shape.n_heads)]
    widths = [tokens] * n
    predict, cost = importance_cost(n_layers, first, widths, cfg.batch_size)
    ops = len(cfg.operations)
    token_layers = ops * (predict + cost.intact_token_layers + cost.row_token_layers)
    parts = {"head importance": (token_layers, ops * (n + cost.end_rows))}
    calls = ops * (math.ceil(n / cfg.batch_size) + math.ceil(cost.end_rows / cfg.batch_size))
    deep = cna_layers(n_layers, cfg)
    parts["comparative neurons"] = comparative_cost(n_layers, shape.d_mlp, len(deep), widths)
    configurations = len(cfg.keep_sizes) * (1 + cfg.n_random)
    pruned = pruning_cost(n_layers, min(deep), configurations, widths, cfg.batch_size)
    parts["pruning"] = (2 * pruned[0], 2 * pruned[1])  # held-out and ranking prompts
    calls += 3 + 2 * (1 + configurations) * math.ceil(n / cfg.batch_size)
    train_batch = min(LORA_BATCH, n)
    if cfg.lora:
        steps = cfg.lora_steps if cfg.adapter is None else 0
        layer = cfg.lora_layer if cfg.lora_layer is not None else min(deep)
        forward, backward, rows = lora_cost(n_layers, layer, steps, train_batch, n, tokens, cfg.top_neurons)
        parts["lora"] = (forward + backward, rows)
        calls += 2 * steps + 4
    work = wk.token_layer_work(shape, parts, ops * n, tokens, calls, "plan/stage_work.py, knockout_cost")
    sizes = {"configurations": len(first) + 1, "prompts_per_intact_pass": max(1, cfg.batch_size // len(first)),
             "cna_layers": list(deep), "pruning_configurations": configurations,
             "lora_batch_size": train_batch}  # fmt: skip
    return work, sizes


def comparative_cost(n_layers: int, d_mlp: int, cna_layers: int, widths: Sequence[int]) -> tuple[int, int]:
    """(token-layers, rows read out) of neurons' step 2 on one operation's prompts of `widths` tokens:
    `comparative_neurons` (the END states of the whole set intact and with the head zeroed, each run through every
    layer) and `attention_li` (one more run). Read out through the whole vocabulary, by the unembedding's weight
    itself (neurons/log_increase.py): the prediction of each run, and per CNA layer every neuron's direction
    W_U U_k (d_mlp rows) and both runs' base logits; per layer, attention_li's logits with and without the
    attention output."""
    n = len(widths)
    token_layers = 3 * n * max(widths) * n_layers
    return token_layers, 2 * n + cna_layers * (d_mlp + 2 * n) + 2 * n * n_layers


def pruning_cost(
    n_layers: int, start: int, configurations: int, widths: Sequence[int], batch_size: int
) -> tuple[int, int]:
    """(token-layers, rows read out) of `pruning_sweep` on one prompt set: per chunk of batch_size prompts the
    intact run, then every pruned configuration from the first pruned layer `start` (`joined_token_layers`);
    every run's END read out, the intact one included."""
    token_layers = 0
    for lo in range(0, len(widths), batch_size):
        chunk = widths[lo : lo + batch_size]
        token_layers += len(chunk) * max(chunk) * n_layers
        token_layers += configurations * joined_token_layers(n_layers, [start] * len(chunk), max(chunk))
    return token_layers, (1 + configurations) * len(widths)


def lora_cost(
    n_layers: int, layer: int, steps: int, train_batch: int, prompts: int, width: int, neurons: int
) -> tuple[int, int, int]:
    """(forward token-layers, backward token-layers, rows read out) of neurons' step 4 on `prompts` prompts
    padded to `width`: `train_layer_lora`'s steps (a forward of `train_batch` prompts, END read out, and a
    backward from the loss down to the trained `layer`: input gradients only, the weights being frozen, as much as
    those layers' forward), then `coefficient_change` with LIs (the coefficients and the END states, without and
    with the adapter, each a run of the whole set through every layer; read out by the unembedding's weight: the
    chosen neurons' directions and each LI run's base logits, planned at one layer)."""
    forward = steps * train_batch * width * n_layers + 4 * prompts * width * n_layers
    backward = steps * train_batch * width * (n_layers - layer)
    return forward, backward, steps * train_batch + 2 * (neurons + prompts)
