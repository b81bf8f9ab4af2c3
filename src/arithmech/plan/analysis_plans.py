"""The plans of the analysis stages: agreement, attention, mlp, fourier, heuristics (work and memory), neurons' memory.

Work comes from plan/analysis_work.py (each cost checked against its engine in tests/unit/plan/test_work_counted.py)
on prompts of the planned length; what a plan cannot read without the identify run or the tokenizer is planned
at its upper bound and named where it is used:
- the identify run's variant (agreement's path method): path, identify's default;
- the chosen heads' layers (attention): the last layer;
- the pairs whose answer the counterfactual moves (agreement's mediation): all of them;
- the numbers of the index (fourier, --numbers unset): PLANNED_NUMBERS, the stage's cap, the most filters;
- an operand grid's pairs (heuristics): max_pairs per operation.

Memory (plan/memory.py's terms) is the stage's largest step:
    numbers     a grid pass with its layers' states, or a site's chunk of pairs: their clean and corrupted runs
                (every layer's input residual and the cache), the variants' float64 vectors and a block of patched
                rows; beside them, every site's float64 means per value and layer and every fit's float64
                prediction of each value (the result keeps them: on the CPU)
    agreement   the largest of its methods: path and attribution as identify plans them; zero ablation at END
                keeps every prompt's cache and END states (one reference run of all of them at once), and
                a decoding step of TOTAL_MAX_ROWS rows read out through the whole vocabulary in float32
                (the logits and the softmax of one sender's rows); at every position, the knockout's passes;
                mediation, the counterfactual run of every prompt and a block of intervened rows
    attention   a pass without logits, and the [prompt, layer, head, pos] float32 END rows kept
    mlp, fourier  a pass of a chunk and its END states; the readout of a chunk (fourier's filters) or of the
                example prompt's every layer (mlp)
    heuristics  the larger of the scan's pass and the sweep's: the prompts' cache of one pass and batch_size
                END rows with their neuron masks and sources ([row, layer, d_mlp], bool and float32) and logits
"""

from __future__ import annotations

import math
from typing import Any

from arithmech.patching.scan_cost import TOTAL_MAX_ROWS
from arithmech.plan import analysis_work as aw
from arithmech.plan import memory as mem
from arithmech.plan import stage_work as sw
from arithmech.plan import work as wk
from arithmech.plan.shape import ModelShape
from arithmech.stages.heuristics_config import default_ks
from arithmech.stages.neurons_config import LORA_BATCH

LI_BLOCK_ELEMENTS = 2**25
"""The largest [row, neuron, d_vocab] block of LI logits (neurons/log_increase.DEFAULT_MAX_ELEMENTS)."""
PLANNED_NUMBERS = 1000
"""Numbers of the Fourier index planned when --numbers is unset: the stage's cap (every single-token number, at
most 1000), the most filters."""


def agreement_plan(
    shape: ModelShape, cfg: Any, tokens: int, query: int, b: int
) -> tuple[wk.Work, mem.MemoryPlan, dict[str, Any]]:
    """agreement on max_prompts prompts of `tokens` tokens, reference and counterfactual apart from `query`
    tokens before the end."""
    s, n = shape, cfg.max_prompts
    widths, shared = [tokens] * n, max(0, tokens - query)
    parts: dict[str, float] = {}
    plans: list[mem.MemoryPlan] = []
    calls = 0
    for method in cfg.methods:
        if method in ("path", "attribution"):
            if method == "path":
                w = wk.scan_work(s, "path", n, tokens, shared, cfg.batch_size)
                plans.append(mem.scan_memory(s, b, cfg.batch_size, tokens, "path"))
            else:
                w = wk.attribution_work(s, n, tokens, cfg.batch_size)
                plans.append(mem.attribution_memory(s, b, cfg.batch_size, tokens))
            parts[method], calls = w.passes, calls + w.weight_reads
            continue
        if method == "zero-ablation" and cfg.zero_positions == "end":
            cost = aw.zero_end_cost(s.n_layers, s.n_heads, widths)
            plans.append(zero_end_memory(s, b, n, tokens))
            slots = min(s.n_layers * (s.n_heads + 1), max(1, TOTAL_MAX_ROWS // n))
            calls += 1 + 2 * math.ceil(s.n_layers * (s.n_heads + 1) / slots)
        elif method == "zero-ablation":
            knock = aw.zero_all_cost(s.n_layers, s.n_heads, widths, cfg.batch_size)
            cost = aw.Cost(knock.intact_token_layers + knock.row_token_layers, 0, knock.end_rows)
            plans.append(mem.forward_memory(s, b, cfg.batch_size, tokens, cache=True))
            calls += math.ceil(knock.end_rows / cfg.batch_size) + math.ceil(n / cfg.batch_size)
        else:  # mediation: every pair planned as moved
            cost = aw.mediation_end_cost(s.n_layers, widths, [(tokens, shared)] * n)
            block = min(aw.MEDIATION_MAX_ROWS, 2 * s.n_layers)
            one = mem.forward_memory(s, b, block, query)
            plans.append(mem.MemoryPlan(
                weights=mem.weight_bytes(s, b),
                activations_clean=mem.kv_cache_bytes(s, 2, tokens, b) + 2 * s.n_layers * tokens * s.d_model * b,
                temporary=max(one.temporary, mem.forward_temporary(s, n, tokens, b) + n * s.d_vocab * 4),
                notes=("clean: a pair's base and alternative keys, values and residuals",
                       "temporary: every prompt's counterfactual run or a block of intervened rows"),
            ))  # fmt: skip
            calls += 1 + n * (1 + query * math.ceil(2 * s.n_layers / block))
        parts[method] = wk.cost_work(s, {method: cost}, n, tokens, 0, "").passes
    work = wk.Work(sum(parts.values()), calls, parts, "plan/analysis_work.py (agreement), patching/scan_cost.py")
    memory = max(plans, key=lambda m: m.peak)
    sizes = {"batch_size": cfg.batch_size, "max_rows": TOTAL_MAX_ROWS, "methods": list(cfg.methods)}
    return work, memory, sizes


def zero_end_memory(shape: ModelShape, b: int, prompts: int, tokens: int) -> mem.MemoryPlan:
    """agreement's zero ablation at the last token (patching/total.patched_end_logits): every prompt's cache and
    END states from one reference run of all of them; then, per decoding step of TOTAL_MAX_ROWS (sender, prompt)
    rows, the senders' residuals, the prompts' cache with the step's slots appended, and the larger of the step
    (each row's MLP and residuals, the slots' attention scores at 8 bytes) and its readout: the rows' float32
    logits over the whole vocabulary, one sender's softmax, and the rows' final residuals on their way there."""
    s, n = shape, prompts
    senders = s.n_layers * (s.n_heads + 1)
    slots = min(senders, max(1, TOTAL_MAX_ROWS // n))
    rows = slots * n
    step = rows * (3 * s.d_mlp + 4 * s.d_model) * b + n * s.n_heads * slots * (tokens - 1 + slots) * 8
    readout = rows * s.d_vocab * 4 + 2 * n * s.d_vocab * 4 + 4 * rows * s.d_model * b
    around = mem.kv_cache_bytes(s, n, tokens - 1 + slots, b) + senders * n * s.d_model * b
    return mem.MemoryPlan(
        weights=mem.weight_bytes(s, b),
        activations_clean=mem.kv_cache_bytes(s, n, tokens, b) + mem.end_state_bytes(s, n, b),
        temporary=max(mem.forward_temporary(s, n, tokens, b), around + max(step, readout)),
        notes=("clean: every prompt's cache and END states", "temporary: the reference run of every prompt or a "
               "decoding step, its cache and its rows' float32 logits"),
    )  # fmt: skip


def attention_plan(shape: ModelShape, cfg: Any, tokens: int, b: int) -> tuple[wk.Work, mem.MemoryPlan]:
    """analyze attention on max_prompts prompts, the chosen heads planned in the last layer."""
    s, n = shape, cfg.max_prompts
    cost = aw.attention_cost(s.n_layers - 1, [tokens] * n, cfg.batch_size)
    work = wk.cost_work(s, {"END attention": cost}, n, tokens, math.ceil(n / cfg.batch_size),
                        "plan/analysis_work.py attention_cost")  # fmt: skip
    memory = mem.MemoryPlan(
        weights=mem.weight_bytes(s, b),
        activations_clean=n * s.n_layers * s.n_heads * tokens * 4,
        temporary=mem.forward_temporary(s, cfg.batch_size, tokens, b),
        notes=("clean: the END rows of every prompt, layer and head (float32)", "temporary: a layer's attention"),
    )
    return work, memory


def mlp_plan(shape: ModelShape, cfg: Any, tokens: int, b: int) -> tuple[wk.Work, mem.MemoryPlan]:
    """analyze mlp on max_prompts prompts."""
    s, n, batch = shape, cfg.max_prompts, cfg.batch_size
    cost = aw.mlp_lens_cost(s.n_layers, [tokens] * n, batch)
    work = wk.cost_work(s, {"MLP logit lens": cost}, n, tokens, math.ceil(n / batch), "plan/analysis_work.py")
    memory = mem.MemoryPlan(
        weights=mem.weight_bytes(s, b),
        activations_clean=mem.end_state_bytes(s, batch, b),
        temporary=max(mem.forward_temporary(s, batch, tokens, b), (s.n_layers + 1) * s.d_vocab * 4),
        notes=("clean: a chunk's END states", "temporary: a layer's attention or MLP, or the example's readouts"),
    )
    return work, memory


def fourier_plan(shape: ModelShape, cfg: Any, tokens: int, b: int) -> tuple[wk.Work, mem.MemoryPlan, dict[str, Any]]:
    """analyze fourier on max_prompts prompts, its filters over cfg.numbers (or PLANNED_NUMBERS) numbers."""
    s, n, batch = shape, cfg.max_prompts, cfg.batch_size
    filters = len(cfg.filter_plan(cfg.numbers or PLANNED_NUMBERS))
    cost = aw.fourier_cost(s.n_layers, [tokens] * n, batch, filters)
    work = wk.cost_work(s, {"spectra and filters": cost}, n, tokens, (2 + filters) * math.ceil(n / batch),
                        "plan/analysis_work.py fourier_cost")  # fmt: skip
    memory = mem.MemoryPlan(
        weights=mem.weight_bytes(s, b),
        activations_clean=mem.end_state_bytes(s, batch, b),
        temporary=mem.forward_temporary(s, batch, tokens, b) + batch * s.d_vocab * 4,
        notes=("clean: a chunk's END states", "temporary: a layer's attention or MLP and a chunk's END logits"),
    )
    return work, memory, {"batch_size": batch, "filters": filters}


def heuristics_plan(
    shape: ModelShape, cfg: Any, tokens: int, query: int, b: int
) -> tuple[wk.Work, mem.MemoryPlan, dict[str, Any], int]:
    """heuristics on max_pairs grid prompts per operation, sharing all but their last `query` tokens."""
    s, n, batch = shape, cfg.max_pairs, cfg.batch_size
    ks = tuple(sorted(set(cfg.ks))) if cfg.ks else default_ks(s.d_mlp)
    configurations = cfg.sweep_configurations(ks)
    prefix = max(0, tokens - query)
    cost = aw.heuristics_cost(s.n_layers, [tokens] * n, prefix, configurations, batch)
    ops = len(cfg.operations)
    per_pass = max(1, batch // configurations)
    calls = ops * (math.ceil(n / batch) + 1 + math.ceil(n / per_pass))
    total = aw.Cost(ops * cost.token_layers, 0, ops * cost.readout_rows)
    work = wk.cost_work(s, {"scan and ablation": total}, ops * n, tokens, calls, "plan/analysis_work.py")
    layers = len(cfg.layers) if cfg.layers else s.n_layers - s.n_layers // 2  # default: the second half
    rows = per_pass * configurations
    sweep = rows * layers * s.d_mlp * 5 + 2 * rows * s.d_vocab * 4 + mem.forward_temporary(s, rows, 1, b)
    scan = mem.forward_temporary(s, batch, tokens, b) + batch * s.d_vocab * 4 + 2 * batch * layers * s.d_mlp * 4
    memory = mem.MemoryPlan(
        weights=mem.weight_bytes(s, b),
        activations_clean=mem.kv_cache_bytes(s, per_pass, tokens, b),
        temporary=max(scan, sweep),
        notes=("clean: the prompts' cache of one ablation pass", "temporary: the scan's pass or the sweep's END rows "
               "with their neuron masks, sources and logits"),
    )  # fmt: skip
    sizes = {"batch_size": batch, "ks": list(ks), "configurations": configurations, "prompts_per_pass": per_pass}
    return work, memory, sizes, ops * n


def neurons_memory(shape: ModelShape, cfg: Any, tokens: int, b: int) -> mem.MemoryPlan:
    """neurons: the largest of head importance's knockout passes (batch_size rows with their cache), comparative
    neurons' two runs' END states of the set with its LI blocks, the top neurons' report, a LoRA step (the frozen
    layers' autograd graph from the trained layer up, planned from the first deep layer, and the END logits' loss)
    and the LoRA's coefficient change.
    Every readout through the unembedding (models/readout.unembed_weight) holds W_U in float32, a copy unless the
    model is in float32, and a layer's float32 neuron directions [d_mlp, d_model] (log_increase.neuron_directions:
    built from a cast copy of the value vectors in a 16-bit model, times the post-MLP norm's gain where there is
    one). An LI block is a chunk of neurons' float32 [row, neuron, d_vocab] logits (at most
    log_increase.DEFAULT_MAX_ELEMENTS numbers); four are alive at once in `neuron_li_of_runs` (the second run's
    product and sum while the first run's logits and log-softmax are still bound), five with a logit soft-cap,
    with the chunk's directions read out, [neuron, d_vocab]. The coefficient change merges the LoRA into the
    adapted layer's MLP (lora_effect._merged): a copy of its matrices, beside the readout or, while peft merges
    or unmerges a matrix, its float32 delta B A and the delta's scaled copy (the adapter is float32 in any
    model)."""
    s, n = shape, cfg.max_prompts
    importance = mem.forward_memory(s, b, cfg.batch_size, tokens, cache=True)
    deep = len(sw.cna_layers(s.n_layers, cfg))
    states = 2 * (mem.end_state_bytes(s, n, b) + 2 * n * deep * s.d_mlp * b)  # END states and coefficients
    unembed = s.d_vocab * s.d_model * 4 if b != 4 else 0
    directions = s.d_mlp * s.d_model * 4
    building = directions * (1 + (b != 4) + (s.norms_per_layer == 4))
    neurons = min(s.d_mlp, max(1, LI_BLOCK_ELEMENTS // (n * s.d_vocab)))  # a chunk of neurons, log_increase.py
    block = (4 + s.logit_softcap) * n * neurons * s.d_vocab * 4 + neurons * s.d_vocab * 4
    readout = unembed + max(building, directions + block)
    comparative = states + max(readout, mem.forward_temporary(s, n, tokens, b))
    train = min(LORA_BATCH, n)
    layer = cfg.lora_layer if cfg.lora_layer is not None else s.n_layers - deep
    graph = train * tokens * (s.n_layers - layer) * mem.saved_per_token_layer(s, tokens, b, frozen=True)
    graph += train * tokens * mem.hooked_input_bytes(s, b)  # the adapted layer's MLP input, planned as a layer's
    lora = graph + 12 * train * s.d_vocab + mem.forward_temporary(s, train, tokens, b) if cfg.lora else 0
    delta = 2 * s.d_model * s.d_mlp * 4  # peft's float32 B A and its scaled copy, merging or unmerging a matrix
    merged = s.mlp_matrices * s.d_model * s.d_mlp * b + max(unembed + building, delta) if cfg.lora else 0
    after = mem.MemoryPlan(
        weights=mem.weight_bytes(s, b),
        temporary=max(comparative, lora, merged),
        notes=("temporary: the largest of comparative neurons' END states with W_U in float32, the neuron "
               "directions and an LI block, a LoRA step's graph, and the LoRA's merged MLP",),
    )  # fmt: skip
    return max(importance, after, key=lambda plan: plan.peak)  # one phase after another: the knockout's cache is gone


DEFAULT_FAMILIES, DEFAULT_PCA = 26, 6
"""Families fitted when --families is unset, PCAs among them (which have no shuffled control): those of two-digit
operands on a tokenizer that splits digits (10..99, analysis/number_fits.families), the default that fits the most."""
FAMILY_KINDS = {"helix": 15, "circle": 5, "pca": 8, "poly": 7}
"""The most families a kind named in --families selects (helices over every subset of 4 periods, ...)."""
DEFAULT_SITES, CONTROL_FAMILIES = 5, 3
"""Sites read when --sites is unset (two places of each operand and the last token), beside the control (b's place
read as a's) that fits at most the largest helix, the digit circles and a PCA."""
NUMBERS_QUERY_TOKENS = 8
"""Positions a patched row runs, from the operand it patches to the end of the query ("47 + 23 = " split into
digits)."""


def numbers_plan(
    shape: ModelShape, cfg: Any, tokens: int, b: int, cpu: bool
) -> tuple[wk.Work, mem.MemoryPlan, dict[str, Any]]:
    """analyze numbers (stages/numbers.py, numbers_patching.py): the grid's passes with the chosen layers' states
    and the float64 means they add up, then per site a chunk of pairs' clean and corrupted runs (the residual
    entering every layer and the keys/values) and every variant's row joining one of them at its layer.
    Where the config leaves them open: two-digit operands split into digits, every family and DEFAULT_SITES sites
    (the most fits); each fit keeps its prediction of every value (the result holds them), and a site's shuffled
    controls theirs while it is patched. The means, fits and Clock states live in host memory: in the peak on a
    CPU (`cpu`), beside it on a GPU (sizes' host_bytes)."""
    s, batch = shape, cfg.batch_size
    values = (cfg.high if cfg.high is not None else 100) - (cfg.low if cfg.low is not None else 10)
    layers = len(cfg.layers) if cfg.layers is not None else s.n_layers
    named = cfg.families or ()
    families = DEFAULT_FAMILIES if cfg.families is None else sum(FAMILY_KINDS.get(f, 1) for f in named)
    pca = DEFAULT_PCA if cfg.families is None else sum(FAMILY_KINDS.get(f, 1) for f in named if f.startswith("pca"))
    sites = DEFAULT_SITES if cfg.sites is None else len([x for x in cfg.sites if x != "clock"])
    control = cfg.sites is None or any(site.startswith("a") for site in cfg.sites)  # b's place read as a's
    per_site = (families - pca) * (1 + cfg.shuffles) + pca  # fits with their shuffled controls (PCA: none)
    control_fits = min(families, CONTROL_FAMILIES)
    kept_fits = layers * (sites * families + control * control_fits)  # the fits proper keep their prediction
    sites += control
    clock = cfg.sites is None or "clock" in cfg.sites
    grid, pairs, query = min(cfg.max_pairs, values * values), cfg.max_prompts, min(NUMBERS_QUERY_TOKENS, tokens)
    variants = layers * (1 + 2 * per_site + 2 * families)  # per pair: the layer, each fit's two, two per family
    rows = min(cfg.max_rows, variants * batch)
    # the means, every fit's prediction of each value and, while a site is patched, its controls' too
    kept = (sites * values * layers * s.d_model * 8 + (kept_fits + layers * per_site) * values * s.d_model * 8
            + (grid * layers * s.d_model * 4 if clock else 0))  # fmt: skip
    states = mem.forward_temporary(s, batch, tokens, b) + (layers + 1) * batch * tokens * s.d_model * b
    runs = 2 * ((s.n_layers + 1) * batch * tokens * s.d_model * b + mem.kv_cache_bytes(s, batch, tokens, b))
    block = (rows * query * s.d_model * b + mem.kv_cache_bytes(s, batch, tokens, b)
             + 2 * rows * s.n_kv_heads * s.d_head * tokens * b + mem.forward_temporary(s, rows, query, b))
    memory = mem.MemoryPlan(
        weights=mem.weight_bytes(s, b),
        activations_clean=kept if cpu else 0,
        temporary=max(states, runs + 2 * variants * batch * s.d_model * 8 + block),
        notes=("clean (host memory: counted on a CPU only; sizes' host_bytes): every site's float64 means per value "
               "and layer, every fit's prediction of each value (kept in the result) and the "
               "Clock's last-token states",
               "temporary: a grid pass with its layers' states, or a chunk's two runs, its variants' float64 "
               "vectors and a block of rows with a prefix copy and a layer's keys and values grown for them"),
    )  # fmt: skip
    parts = {
        "grid": (grid * tokens * s.n_layers, grid),
        "bases": (sites * 2 * pairs * tokens * s.n_layers, 2 * sites * pairs),
        "rows": (sites * variants * pairs * query * (s.n_layers + 1) // 2, sites * variants * pairs),
    }
    calls = math.ceil(grid / batch) + sites * math.ceil(pairs / batch) * (2 + math.ceil(variants * batch / rows))
    work = wk.token_layer_work(s, parts, grid, tokens, calls, "stages/numbers_grid.py TokenLayers")
    return work, memory, {"grid_prompts": grid, "batch_size": batch, "max_rows": cfg.max_rows,
                          "families": families, "sites": sites, "host_bytes": kept}  # fmt: skip
