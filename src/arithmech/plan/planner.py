"""One stage's plan: its batch and chunk sizes, planned memory per process layout, work and estimated time.

`plan_stage(shape, stage, cfg, options)` reads the stage's own config object (stages/*_config.py) for what the
engine will do, and the sizes below for what a plan cannot read without a tokenizer: the tokens of a prompt
(`PROMPT_TOKENS`, or --prompt-tokens) and, for training, the examples of a step.

Process layouts (distributed.py, finetune/train.py): `single` is one process; `ddp` splits a sharded stage's
prompts (identify, knockout, mediation) or finetune's batch over P processes, each holding the whole model, so its
memory is one process's and its time a P-th; `fsdp2` (finetune only) splits weights, gradients and moments over P
and gathers one layer at a time; `auto` (--device auto) spreads the layers over P devices in one process: the
largest device holds its share of the weights and, planned conservatively, every activation.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from arithmech.circuits.attribution_cost import SWEEP_CIRCUITS_PER_PASS
from arithmech.knockout import configurations as kc
from arithmech.patching import mediation_cost as mc
from arithmech.patching.scan_cost import TOTAL_MAX_ROWS
from arithmech.plan import analysis_plans as ap
from arithmech.plan import memory as mem
from arithmech.plan import stage_work as sw
from arithmech.plan import work as wk
from arithmech.plan.devices import DeviceProfile
from arithmech.plan.shape import DTYPE_BYTES, ModelShape

PROMPT_TOKENS = {"circuit": 16, "evaluate": 256}
"""Tokens of a prompt the plan assumes (--prompt-tokens overrides): MIB's arithmetic prompts are ~16 tokens, the
evaluate benchmarks' few-shot prompts a few hundred, the other stages' templates with 3 solved examples ~48
(docs/performance.md: the default reference set has 26 to 70 tokens)."""
DEFAULT_TOKENS = 48
QUERY_TOKENS = 5
"""Tokens at the end of a prompt where reference and counterfactual differ (the query's operator onwards)."""
CIRCUIT_SHARED_TOKENS = 6
"""MIB's "Q: How much is" before the operands, in the tokens of the usual BPE tokenizers."""
SHARDED = ("identify", "knockout", "mediation", "finetune")
"""Stages that split their work over the processes of a launch (pipeline.STAGES sharded)."""
PAPER_SFT_ROWS = 3260


@dataclass(frozen=True)
class PlanOptions:
    """What a plan is made for: dtype, device profile, processes, and the sizes it cannot read."""

    dtype: str
    device: DeviceProfile
    processes: int = 1
    prompt_tokens: int | None = None
    shared_tokens: int | None = None
    """circuit: the tokens every prompt shares at the start (MIB's "Q: How much is"), run once and never patched;
    None: CIRCUIT_SHARED_TOKENS (a character-level tokenizer makes 15 of them)."""


@dataclass(frozen=True)
class StagePlan:
    """The plan of one stage (plan.json's `stages` entries)."""

    stage: str
    prompts: int
    tokens: int
    sizes: dict[str, Any]
    memory: dict[str, mem.MemoryPlan]
    work: wk.Work | None
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "prompts": self.prompts,
            "tokens_per_prompt": self.tokens,
            "sizes": self.sizes,
            "planned_memory": {layout: m.as_dict() for layout, m in self.memory.items()},
            "work": None if self.work is None else self.work.as_dict(),
            "estimated_seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }


def _trained_numbers(shape: ModelShape, cfg: Any) -> int:
    """Numbers finetune trains: every parameter; LoRA's r (in + out) on q, k, v, o of every layer; or precise
    SFT's head slices (W_Q rows, W_K and W_V rows of the head's key-value head, W_O columns) and whole MLPs."""
    s = shape
    if cfg.method == "full":
        return s.n_params
    if cfg.method == "lora":
        q, kv = s.n_heads * s.d_head, s.n_kv_heads * s.d_head
        return s.n_layers * cfg.lora_r * ((s.d_model + q) * 2 + 2 * (s.d_model + kv))
    heads = len([c for c in cfg.components or () if not c.startswith("mlp")]) or cfg.top_k
    mlps = len(cfg.mlps) + cfg.top_mlps
    return heads * 4 * s.d_head * s.d_model + mlps * s.mlp_matrices * s.d_model * s.d_mlp


def _hooked_layers(shape: ModelShape, cfg: Any) -> dict[str, int]:
    """Precise SFT's layers whose projections keep inputs for a trained delta: those of the heads given, or as many
    as the run's top_k heads can span (at most every layer); and the whole MLPs it trains. Other methods: none
    given (training_memory's default: every layer for LoRA)."""
    if cfg.method != "precise":
        return {}
    heads = [layer for layer, head in _component_layers(tuple(cfg.components or ())) if head]
    layers = len(set(heads)) if heads else min(cfg.top_k, shape.n_layers)
    return {"hooked_layers": layers, "mlp_layers": min(shape.n_layers, len(cfg.mlps) + cfg.top_mlps)}


def _component_layers(names: tuple[str, ...]) -> list[tuple[int, bool]]:
    """(layer, is_head) of components named "14.2" or "mlp.20" (models/sites.py's names)."""
    return [(int(n.split(".")[1]), False) if n.startswith("mlp") else (int(n.split(".")[0]), True) for n in names]


def _knockout_configurations(shape: ModelShape, cfg: Any) -> list[int]:
    """The lowest ablated layer of each configuration of the sweep (knockout/configurations.py), drawn as the
    engine draws them; a ranking read from an identify run is not known here, so its components are planned at
    layer 0 (every row from the first layer: an upper bound), as many as the model has (a small model has fewer
    heads than max_k)."""
    k = cfg.largest_k
    heads = kc.layer_pool(shape.n_layers, shape.n_heads, cfg.include_mlps)
    ranked = _component_layers(cfg.components) if cfg.components else [(0, True)] * min(k, len(heads))
    mlps = cfg.include_mlps or any(not head for _, head in ranked)
    pool = kc.layer_pool(shape.n_layers, shape.n_heads, mlps)
    swept = kc.sweep_configurations(ranked, pool, k, cfg.n_random, cfg.seed, lambda c: c[1])
    return [min((layer for layer, _ in comps), default=shape.n_layers) for _, comps in swept]


def _knockout_sets(cfg: Any) -> int:
    """Prompt sets swept: held out and in sample with --from (unless --no-held-out), else one."""
    return 2 if cfg.from_run and cfg.held_out else 1


def _knockout_sizes(shape: ModelShape, cfg: Any) -> dict[str, Any]:
    configurations = len(_knockout_configurations(shape, cfg))
    return {"configurations": configurations, "prompt_sets": _knockout_sets(cfg), "max_k": cfg.largest_k,
            "prompts_per_intact_pass": max(1, cfg.batch_size // configurations)}  # fmt: skip


def _knockout(shape: ModelShape, cfg: Any, tokens: int) -> wk.Work:
    """knockout_scores on each prompt set (knockout/configurations.knockout_cost), after one plain run of the set
    for mean or resample values (the set planned as large as the sample: its size is the identify run's)."""
    sets, n = _knockout_sets(cfg), cfg.max_prompts
    cost = kc.knockout_cost(shape.n_layers, _knockout_configurations(shape, cfg), [tokens] * n, cfg.batch_size)
    values = 0 if cfg.ablation == "zero" else n * tokens * shape.n_layers
    parts = {"ablation values": (sets * values, 0), "intact runs": (sets * cost.intact_token_layers, 0),
             "configurations": (sets * cost.row_token_layers, sets * cost.end_rows)}  # fmt: skip
    calls = sets * (math.ceil(cost.end_rows / cfg.batch_size) + math.ceil(n / cfg.batch_size) * 2)
    return wk.token_layer_work(shape, parts, sets * n, tokens, calls, "knockout/configurations.py knockout_cost")


def _knockout_memory(shape: ModelShape, cfg: Any, batch: int, tokens: int, b: int) -> mem.MemoryPlan:
    """knockout (stages/knockout.py, knockout/ablation.py, batched.py): every prompt set's ablation values are made
    before any sweep, each from chunks of its counterfactual (mean) or reference (resample) runs with every layer's
    o_proj input and MLP output collected; then the sweep's calls, beside all of them, of up to batch_size
    (configuration, prompt) rows (max(1, batch_size // configurations) prompts a chunk, every configuration of
    each), without a cache, each ending in the rows' END readout. Values per set and layer: float32 [group + END
    row, pos, width] sums of the mean (one group planned) or every prompt's values (resample)."""
    s, sets = shape, _knockout_sets(cfg)
    widths = s.n_heads * s.d_head + s.d_model  # an o_proj input and an MLP output
    values = {"zero": 0, "mean": s.n_layers * 2 * tokens * widths * 4}.get(cfg.ablation)
    values = s.n_layers * cfg.max_prompts * tokens * widths * b if values is None else values  # resample
    configurations = len(_knockout_configurations(shape, cfg))
    rows = min(batch, configurations * max(1, batch // configurations), configurations * cfg.max_prompts)
    passes = mem.forward_memory(s, b, rows, tokens)
    passes = dataclasses.replace(passes, activations_counterfactual=sets * values,
                                 notes=(*passes.notes, "counterfactual: every prompt set's values"))  # fmt: skip
    if cfg.ablation == "zero":
        return passes
    collected = s.n_layers * batch * tokens * widths * b
    made = sets - 1 + (cfg.max_prompts > batch)  # a set's own sums exist from its first chunk's end
    run = mem.MemoryPlan(weights=passes.weights, activations_counterfactual=made * values,
                         temporary=mem.forward_temporary(s, batch, tokens, b) + collected,
                         notes=("counterfactual: the earlier prompt sets' ablation values and the last set's sums",
                                "temporary: a values run with every layer's o_proj input and MLP output"))  # fmt: skip
    return _larger(run, passes)


def _mediation(shape: ModelShape, cfg: Any, tokens: int, b: int) -> tuple[wk.Work, mem.MemoryPlan, dict[str, Any]]:
    """mediate (patching/mediation_cost.py): per task, n_pairs pairs whose base and alternative first differ at
    the query (QUERY_TOKENS before the end); the neurons of one layer (the neuron layer, or layer 0 when it is
    chosen from the effects: the most layers, an upper bound)."""
    layers = list(cfg.layers) if cfg.layers is not None else list(range(shape.n_layers))
    sites = [layer for _ in cfg.components for layer in layers]
    pairs = [(tokens, max(0, tokens - QUERY_TOKENS))] * cfg.n_pairs
    token_layers, rows = mc.mediation_cost(shape.n_layers, sites, pairs, cfg.max_rows)
    parts = {"interventions": (len(cfg.tasks) * token_layers, len(cfg.tasks) * rows)}
    calls = cfg.n_pairs * (1 + QUERY_TOKENS * math.ceil(len(sites) / cfg.max_rows))
    if cfg.neuron_k:
        layer = cfg.neuron_layer if cfg.neuron_layer is not None else 0
        neuron_layers, neuron_rows = mc.neuron_cost(shape.n_layers, layer, shape.d_mlp, pairs, cfg.max_rows)
        parts["neurons"] = (len(cfg.tasks) * neuron_layers, len(cfg.tasks) * neuron_rows)
        calls += cfg.n_pairs * (1 + math.ceil(shape.d_mlp / cfg.max_rows))
    work = wk.token_layer_work(shape, parts, cfg.n_pairs * len(cfg.tasks), tokens, calls * len(cfg.tasks),
                               "patching/mediation_cost.py")  # fmt: skip
    rows_at_once = min(cfg.max_rows, len(sites))
    one = mem.forward_memory(shape, b, rows_at_once, QUERY_TOKENS)
    cache = mem.kv_cache_bytes(shape, 2, tokens, b) + 2 * shape.n_layers * tokens * shape.d_model * b
    first = mem.forward_temporary(shape, 2, tokens, b)  # the [base; alternative] run that makes the cache
    prefix = mem.kv_cache_bytes(shape, 1, tokens, b)  # the base row's prefix copy
    layer = mem.forward_temporary(shape, rows_at_once, QUERY_TOKENS, b)
    joined = layer + mem.joined_kv_bytes(shape, rows_at_once, tokens, b)  # a layer with the rows' keys and values
    block = prefix + max(one.temporary, joined)  # a layer's keys and values are gone by the readout
    if cfg.neuron_k:  # a block of neurons' rows runs the last position only, then its logits
        neuron_rows = min(cfg.max_rows, shape.d_mlp)
        grown = mem.joined_kv_bytes(shape, neuron_rows, tokens, b) + prefix
        block = max(block, mem.forward_temporary(shape, neuron_rows, 1, b) + grown,
                    mem.readout_bytes(shape, b, neuron_rows))
    alternative = len(sites) * tokens * shape.d_model * b  # each site's output in the alternative run
    memory = dataclasses.replace(one, activations_clean=cache, activations_counterfactual=alternative,
                                 temporary=max(block, first), notes=(
        "clean: the base and alternative run's keys, values and residuals", "counterfactual: every site's output "
        "in the alternative run", "temporary: the larger of that run's layer and a block of max_rows intervened "
        "rows over the query's positions with their logits (neurons': the last position), a layer's keys and "
        "values grown for the rows and the base row's prefix cache"))  # fmt: skip
    sizes = {"max_rows": cfg.max_rows, "sites": len(sites), "pairs_per_task": cfg.n_pairs, "tasks": len(cfg.tasks)}
    return work, memory, sizes


def _answer_check(shape: ModelShape, b: int, batch: int, tokens: int) -> mem.MemoryPlan:
    """The check of which prompts the model answers (models/predictions.py), before a scan: plain forward passes
    of `batch` prompts and the readout of their answer positions."""
    return mem.forward_memory(shape, b, batch, tokens)


def _larger(*plans: mem.MemoryPlan) -> mem.MemoryPlan:
    """The plan of the phase with the largest peak (phases that run one after another)."""
    return max(plans, key=lambda plan: plan.peak)


def _layouts(stage: str, single: mem.MemoryPlan, processes: int, fsdp: mem.MemoryPlan | None) -> dict[str, Any]:
    layouts = {"single": single}
    if processes > 1:
        if stage in SHARDED:
            layouts["ddp"] = single
        if fsdp is not None:
            layouts["fsdp2"] = fsdp
        layouts["auto"] = dataclasses.replace(single, weights=math.ceil(single.weights / processes))
    return layouts


def plan_stage(shape: ModelShape, stage: str, cfg: Any, options: PlanOptions) -> StagePlan:
    """The stage's plan (module docstring)."""
    b = DTYPE_BYTES[options.dtype]
    tokens = options.prompt_tokens or PROMPT_TOKENS.get(stage, DEFAULT_TOKENS)
    shared = max(0, tokens - QUERY_TOKENS)
    fsdp = None
    if stage == "identify":
        prompts, batch = cfg.max_prompts, cfg.batch_size
        sizes = {"batch_size": batch, "chunks": math.ceil(prompts / batch)}
        if cfg.method == "attribution":
            memory = mem.attribution_memory(shape, b, batch, tokens)
            work = wk.attribution_work(shape, prompts, tokens, batch)
        else:
            memory = _larger(
                mem.scan_memory(shape, b, batch, tokens, cfg.variant), _answer_check(shape, b, batch, tokens)
            )
            work = wk.scan_work(shape, cfg.variant, prompts, tokens, shared, batch)
            if cfg.variant == "total":
                sizes["max_rows"] = TOTAL_MAX_ROWS
            if cfg.method == "both":
                extra = wk.attribution_work(shape, prompts, tokens, batch)
                work = wk.Work(work.passes + extra.passes, work.weight_reads + extra.weight_reads,
                               {**work.parts, **extra.parts}, work.source + "; patching/attribution.py")  # fmt: skip
                grads = mem.attribution_memory(shape, b, batch, tokens)
                memory = memory if memory.peak >= grads.peak else grads
    elif stage == "circuit":
        prompts, batch = cfg.n_prompts, cfg.batch_size
        shared = min(options.shared_tokens if options.shared_tokens is not None else CIRCUIT_SHARED_TOKENS, tokens - 1)
        sizes = {"batch_size": batch, "chunks": math.ceil(prompts / batch), "eap_ig_steps": cfg.steps,
                 "circuits_per_pass": SWEEP_CIRCUITS_PER_PASS}  # fmt: skip
        memory = _larger(
            mem.edge_attribution_memory(shape, b, batch, tokens - shared),
            mem.sweep_memory(shape, b, batch, SWEEP_CIRCUITS_PER_PASS * batch, tokens - shared),
        )
        work = wk.edge_work(shape, cfg, tokens, shared)
    elif stage == "finetune":
        micro = cfg.micro_batch_size
        steps = cfg.max_steps or cfg.epochs * math.ceil((cfg.max_samples or PAPER_SFT_ROWS) / cfg.batch_size)
        prompts = steps * cfg.batch_size
        tokens = options.prompt_tokens or (DEFAULT_TOKENS if cfg.data == "arithmetic" else cfg.max_length)
        accumulation = max(1, cfg.batch_size // (micro * options.processes))
        sizes = {"batch_size": cfg.batch_size, "micro_batch_size": micro, "accumulation_steps": accumulation,
                 "optimizer_steps": steps}  # fmt: skip
        trained = _trained_numbers(shape, cfg)
        hooked = _hooked_layers(shape, cfg)
        number = b if cfg.method != "precise" else 4  # precise SFT trains float32 deltas
        hooked["step_temporary"] = mem.optimizer_step_bytes(shape, trained * number, number, cfg.method,
                                                            options.device.kind == "gpu")  # fmt: skip
        memory = mem.training_memory(shape, b, micro, tokens, cfg.method, trained, **hooked)
        if options.processes > 1:
            fsdp = mem.training_memory(shape, b, micro, tokens, cfg.method, trained, options.processes, fsdp=True,
                                       **hooked)  # fmt: skip
        work = wk.training_work(shape, prompts, tokens, micro)
        sizes["trained_numbers"] = trained
    elif stage == "evaluate":
        prompts, batch = cfg.limit or 100, cfg.batch_size
        sizes = {"batch_size": batch, "max_new_tokens": cfg.max_new_tokens}
        memory = _larger(
            mem.generation_memory(shape, b, batch, tokens, cfg.max_new_tokens), mem.checksum_memory(shape, b)
        )
        work = wk.generation_work(shape, prompts, tokens, cfg.max_new_tokens, batch)
    else:
        prompts = int(getattr(cfg, "max_prompts", None) or getattr(cfg, "n_pairs", None) or 64)
        batch = int(getattr(cfg, "batch_size", None) or 16)
        sizes = {"batch_size": batch}
        if stage == "knockout":
            work, sizes = _knockout(shape, cfg, tokens), {**sizes, **_knockout_sizes(shape, cfg)}
            memory = _knockout_memory(shape, cfg, batch, tokens, b)
        elif stage == "mediation":
            prompts = cfg.n_pairs * len(cfg.tasks)
            work, memory, sizes = _mediation(shape, cfg, tokens, b)
        elif stage == "transfer":
            work, extra = sw.transfer_work(shape, cfg, tokens)
            prompts, sizes = extra["scored_prompts"], {**sizes, **extra}
            memory = mem.forward_memory(shape, b, extra["rows_per_pass"], tokens, cache=True)
        elif stage == "agreement":
            work, memory, sizes = ap.agreement_plan(shape, cfg, tokens, QUERY_TOKENS, b)
        elif stage == "attention":
            work, memory = ap.attention_plan(shape, cfg, tokens, b)
        elif stage == "mlp":
            work, memory = ap.mlp_plan(shape, cfg, tokens, b)
        elif stage == "fourier":
            work, memory, sizes = ap.fourier_plan(shape, cfg, tokens, b)
        elif stage == "heuristics":
            work, memory, sizes, prompts = ap.heuristics_plan(shape, cfg, tokens, QUERY_TOKENS, b)
        elif stage == "numbers":
            work, memory, extra = ap.numbers_plan(shape, cfg, tokens, b, options.device.kind == "cpu")
            prompts, sizes = extra.pop("grid_prompts"), {**sizes, **extra}
        elif stage == "neurons":
            work, extra = sw.neurons_work(shape, cfg, tokens)
            prompts, sizes = cfg.max_prompts * len(cfg.operations), {**sizes, **extra}
            memory = ap.neurons_memory(shape, cfg, tokens, b)
        else:
            raise ValueError(f"the planner has no plan of the {stage} stage")
    layouts = _layouts(stage, memory, options.processes, fsdp)
    seconds: dict[str, float] = {}
    if work is not None:
        one = wk.estimated_seconds(shape, work, prompts, tokens, options.device, options.dtype, b)
        seconds = {"single": one}
        if options.processes > 1:
            if stage in SHARDED:
                seconds["ddp"] = one / options.processes
            if fsdp is not None:
                seconds["fsdp2"] = one / options.processes
            seconds["auto"] = one
    return StagePlan(stage, prompts, tokens, sizes, layouts, work, seconds)
