"""A stage's work in forward-pass equivalents, from the cost models beside the engines, and its estimated time.

The unit is one forward pass of the stage's prompts, each of T tokens, reading the answer's logits at the last
token (the docs' unit, patching/scan_cost.py `prompt_pass_macs`). Where an engine has a cost model as a function,
it is called here on the planned chunks: the path and total scans (`patching/scan_cost.scan_macs`), the oracle
(`circuits/oracle_cost.oracle_passes`). Where the cost is stated in its module docstring only, the number is that
docstring's, named beside it: EAP and EAP-IG (circuits/attribution.py), the faithfulness sweep
(circuits/faithfulness.py), attribution patching (patching/attribution.py). Training counts a backward as two
forwards over every position's logits; generation one decoding step per new token, a pass that reads every weight.

Time (estimated, never measured) is a roofline over the whole stage: the longer of its multiply-accumulates at
devices.MATMUL_EFFICIENCY of the peak FLOP/s and of reading the weights once per batched pass at
devices.BANDWIDTH_EFFICIENCY of the bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arithmech.circuits import attribution_cost as ac
from arithmech.circuits.oracle_cost import oracle_passes
from arithmech.patching.scan_cost import attribution_token_layers, layer_macs, prompt_pass_macs, scan_macs
from arithmech.plan.devices import BANDWIDTH_EFFICIENCY, MATMUL_EFFICIENCY, DeviceProfile
from arithmech.plan.shape import ModelShape


@dataclass(frozen=True)
class Work:
    """Forward-pass equivalents of the prompts, the batched passes that read the weights, and their sources."""

    passes: float
    weight_reads: int
    parts: dict[str, float] = field(default_factory=dict)
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"forward_pass_equivalents": round(self.passes, 3), "weight_reads": self.weight_reads,
                "parts": {k: round(v, 3) for k, v in self.parts.items()}, "cost_model": self.source}  # fmt: skip


def macs_per_pass(shape: ModelShape, prompts: int, tokens: int) -> int:
    """Multiply-accumulates of the unit: `prompts` prompts of `tokens` tokens, the last token's logits."""
    c_attn, c_mlp = _layer(shape)
    return prompt_pass_macs(prompts * tokens, prompts, shape.n_layers, c_attn + c_mlp, shape.d_vocab, shape.d_model)


def _layer(shape: ModelShape) -> tuple[int, int]:
    s = shape
    return layer_macs(s.d_model, s.n_heads, s.n_kv_heads, s.d_head, s.d_mlp, s.mlp_matrices)


def _chunks(prompts: int, batch_size: int) -> list[int]:
    return [min(batch_size, prompts - lo) for lo in range(0, prompts, batch_size)]


def scan_work(shape: ModelShape, variant: str, prompts: int, tokens: int, shared: int, batch_size: int) -> Work:
    """identify's exact scan (path, direct or total), chunks of `batch_size` prompts sharing `shared` tokens."""
    c_attn, c_mlp = _layer(shape)
    chunks = [(n, tokens, shared) for n in _chunks(prompts, batch_size)]
    macs = scan_macs(variant, shape.n_layers, shape.n_heads, c_attn, c_mlp, chunks)
    passes = macs / macs_per_pass(shape, prompts, tokens)
    return Work(passes, 2 * len(chunks), {f"{variant} scan": passes}, "patching/scan_cost.py scan_macs")


def attribution_work(shape: ModelShape, prompts: int, tokens: int, batch_size: int) -> Work:
    """Attribution patching (patching/scan_cost.attribution_token_layers): a counterfactual run, a reference run
    with gradients and its backward (as much work again as its forward, input gradients)."""
    chunks = [(n, tokens) for n in _chunks(prompts, batch_size)]
    forward, backward = attribution_token_layers(shape.n_layers, chunks)
    c_attn, c_mlp = _layer(shape)
    passes = (forward + backward) * (c_attn + c_mlp) / macs_per_pass(shape, prompts, tokens)
    return Work(passes, 3 * len(chunks), {"attribution": passes}, "patching/scan_cost.py attribution_token_layers")


def edge_work(shape: ModelShape, cfg: Any, tokens: int, shared: int) -> Work:
    """circuit (circuits/attribution_cost.py): EAP or EAP-IG for the method and each compared gradient method, on
    the find pairs; the faithfulness sweep of every ranking (the random one once per seed) on the test pairs;
    the oracle (circuits/oracle_cost.py) on 2 x `oracle` edges spread over the receivers."""
    s, (c_attn, c_mlp) = shape, _layer(shape)
    find = [(n, tokens, shared) for n in _chunks(cfg.n_prompts, cfg.batch_size)]
    test = [(n, tokens, shared) for n in _chunks(cfg.test_prompts or cfg.n_prompts, cfg.batch_size)]
    parts: dict[str, float] = {}
    calls = 0
    method = cfg.method or ("eap-ig" if not cfg.from_circuit and not cfg.circuit_file else None)
    for name in dict.fromkeys(m for m in (method, *cfg.compare_methods) if m in ("eap", "eap-ig")):
        points = len(ac.interpolation_points(name, cfg.steps))
        plain, gradient = ac.edge_attribution_token_layers(s.n_layers, find, points)
        forward = c_mlp + s.group_size * c_attn  # the attention on g replicas
        assembly = 3 * s.n_heads * s.d_head * s.d_model
        contraction = ac.contraction_rows(s.n_layers, s.n_heads) * s.d_model * sum(n * (t - z) for n, t, z in find)
        macs = plain * (c_attn + c_mlp) + gradient * (2 * forward + assembly) + contraction
        parts[name] = macs / macs_per_pass(shape, cfg.n_prompts, tokens)
        calls += len(find) * (1 + 2 * points)
    if cfg.evaluate:
        rankings = [m for m in (method, *cfg.compare_methods) if m is not None]
        sweeps = sum(cfg.random_seeds if m == "random" else 1 for m in rankings)
        distinct = ac.sweep_circuits(cfg.percents)
        mean = cfg.ablation == "mean"
        token_layers = ac.sweep_token_layers(s.n_layers, test, distinct, ac.SWEEP_CIRCUITS_PER_PASS, mean)
        parts["faithfulness sweep"] = (
            sweeps * token_layers * (c_attn + c_mlp) / macs_per_pass(shape, sum(n for n, _, _ in test), tokens)
        )
        calls += sweeps * len(test) * (2 + -(-distinct // ac.SWEEP_CIRCUITS_PER_PASS))
    if cfg.oracle:
        receivers = s.n_layers * (3 * s.n_heads + 1) + 1
        per_layer = 3 * s.n_heads + 1
        edges = [(i * receivers // (2 * cfg.oracle), 0) for i in range(2 * cfg.oracle)]  # spread over receivers
        groups: dict[int, int] = {}
        for receiver, _ in edges:
            groups[receiver] = groups.get(receiver, 0) + 1
        layers = [(n, r // per_layer) for r, n in groups.items()]
        parts["oracle"] = oracle_passes(s.n_layers, tokens, [(cfg.batch_size, tokens, shared)], layers)
        calls += int(parts["oracle"] * len(find))
    return Work(sum(parts.values()), calls, parts, "circuits/attribution_cost.py, oracle_cost.py")


def training_work(shape: ModelShape, examples: int, tokens: int, micro_batch: int) -> Work:
    """Fine-tuning `examples` examples: forward and backward (2 x the forward) of every position's logits."""
    c_attn, c_mlp = _layer(shape)
    full = examples * tokens * (shape.n_layers * (c_attn + c_mlp) + shape.d_vocab * shape.d_model)
    passes = 3 * full / macs_per_pass(shape, examples, tokens)
    return Work(passes, 3 * len(_chunks(examples, micro_batch)), {"sft steps": passes}, "finetune/train.py")


def generation_work(shape: ModelShape, prompts: int, tokens: int, new_tokens: int, batch_size: int) -> Work:
    """evaluate: one pass of each prompt, then one decoding step per new token (each batch reads every weight)."""
    c_attn, c_mlp = _layer(shape)
    step = shape.n_layers * (c_attn + c_mlp) + shape.d_vocab * shape.d_model
    macs = macs_per_pass(shape, prompts, tokens) + prompts * new_tokens * step
    passes = macs / macs_per_pass(shape, prompts, tokens)
    batches = len(_chunks(prompts, batch_size))
    return Work(passes, batches * (1 + new_tokens), {"generation": passes}, "evaluate/generation.py")


def token_layer_work(
    shape: ModelShape, parts: dict[str, tuple[int, int]], prompts: int, tokens: int, calls: int, source: str
) -> Work:
    """Work counted as token-layers (one decoder layer on one position of one row) and rows read through the
    unembedding, per part: {name: (token_layers, unembedded rows)}, over the unit of `prompts` prompts."""
    c_attn, c_mlp = _layer(shape)
    unit = macs_per_pass(shape, prompts, tokens)
    passes = {k: (n * (c_attn + c_mlp) + rows * shape.d_vocab * shape.d_model) / unit for k, (n, rows) in parts.items()}
    return Work(sum(passes.values()), calls, passes, source)


def estimated_seconds(
    shape: ModelShape, work: Work, prompts: int, tokens: int, device: DeviceProfile, dtype: str, b: int
) -> float:
    """The roofline time of the module docstring (an estimate)."""
    compute = 2 * work.passes * macs_per_pass(shape, prompts, tokens) / (device.flops(dtype) * MATMUL_EFFICIENCY)
    memory = work.weight_reads * shape.n_params * b / (device.bandwidth * BANDWIDTH_EFFICIENCY)
    return max(compute, memory)


def cost_work(shape: ModelShape, parts: dict[str, Any], prompts: int, tokens: int, calls: int, source: str) -> Work:
    """Work of parts counted as plan/analysis_work.Cost (token-layers, MLP rows, rows read out through the whole
    vocabulary), over the unit of `prompts` prompts."""
    c_attn, c_mlp = _layer(shape)
    unit = macs_per_pass(shape, prompts, tokens)
    v = shape.d_vocab * shape.d_model
    passes = {k: (c.token_layers * (c_attn + c_mlp) + c.mlp_rows * c_mlp + c.readout_rows * v) / unit
              for k, c in parts.items()}  # fmt: skip
    return Work(sum(passes.values()), calls, passes, source)
