"""The planner's work of each stage's engine against the work the engine really does on a tiny random-init model.

Counted (tests/forward_cost.py): token-layers, the rows x positions entering each decoder layer
(`count_layer_tokens`), and multiply-accumulates of every linear layer, unembedding included (`count_work`).
Each cost function is the one `arithmech plan` calls (plan/planner.py, plan/work.py), given the engine's real
prompt lengths; the engines run as their stages call them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from arithmech.circuits.attribution import edge_scores
from arithmech.circuits.attribution_cost import (
    edge_attribution_token_layers,
    interpolation_points,
    sweep_circuits,
    sweep_runs,
    sweep_token_layers,
)
from arithmech.circuits.batch import CircuitBatch
from arithmech.circuits.faithfulness import faithfulness_sweep, top_edges
from arithmech.circuits.graph import CircuitGraph
from arithmech.data.mediation_generate import generate_mediation_pairs
from arithmech.data.mediation_prompts import MediationDataConfig
from arithmech.data.mediation_tokens import tokenize_mediation_pairs
from arithmech.knockout.ablation import ablation_sources
from arithmech.knockout.configurations import knockout_cost, sweep_configurations
from arithmech.knockout.sweep import knockout_sweep
from arithmech.models.archs import spec_for_model_type
from arithmech.models.sites import Component, all_components
from arithmech.models.view import ModelView
from arithmech.patching.attribution import attribution_patch
from arithmech.patching.mediation import COMPONENTS, mediation_effects, neuron_effects
from arithmech.patching.mediation_cost import mediation_cost, neuron_cost
from arithmech.patching.path import PatchingBatch
from arithmech.patching.scan_cost import attribution_token_layers, layer_macs
from arithmech.stages.circuit import random_scores
from reference_circuits import shared_start_batch, tiny_batch, tiny_view

from forward_cost import count_layer_tokens, count_work
from tiny_models import make_tiny_model, make_tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
LENGTHS = [7, 9, 8, 9, 6, 9]


def _view() -> ModelView:
    model = make_tiny_model("llama", seed=0)
    return ModelView(model, spec_for_model_type("llama"))


def _c_layer(view: ModelView) -> int:
    d = view.dims
    return sum(layer_macs(d.d_model, d.n_heads, d.n_kv_heads, d.d_head, view.mlp(0).up_proj.out_features))


def _batch(view: ModelView, lengths: list[int]) -> PatchingBatch:
    gen = torch.Generator().manual_seed(0)
    ref = torch.randint(3, view.dims.d_vocab - 2, (len(lengths), max(lengths)), generator=gen)
    mask = torch.zeros_like(ref)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    cf = ref.clone()
    cf[:, 2] = (cf[:, 2] + 1) % view.dims.d_vocab
    end = torch.tensor(lengths) - 1
    return PatchingBatch(ref, mask, cf, mask.clone(), end, torch.randint(3, 200, (len(lengths),), generator=gen))


@pytest.mark.parametrize("batch_size", [5, 64])
def test_knockout_sweep_work_is_planned(batch_size: int) -> None:
    """Random draws (seeded as the engine draws them) and effect-ranked components set each configuration's
    first layer; the cost model replays the engine's chunks, row blocks and stand-in rows."""
    view = _view()
    batch = _batch(view, LENGTHS)
    sources = ablation_sources(view, batch, "zero", [0] * len(batch))
    pool = all_components(view.dims)
    ranked = [Component(2, 1), Component(1), Component(0, 3), Component(2, 0)]
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        knockout_sweep(view, batch, sources, ranked, pool, 4, n_random=2, seed=7, batch_size=batch_size)
    swept = sweep_configurations(ranked, pool, 4, 2, 7, lambda c: c.head is not None)
    first = [min((c.layer for c in config), default=view.dims.n_layers) for _, config in swept]
    cost = knockout_cost(view.dims.n_layers, first, [n for n in LENGTHS], batch_size)
    assert sum(seen) == cost.intact_token_layers + cost.row_token_layers
    d = view.dims
    assert work.macs == sum(seen) * _c_layer(view) + cost.end_rows * d.d_vocab * d.d_model


def _mediation_items() -> list[Any]:
    cfg = MediationDataConfig(tasks=("addition",), formats=("equation",), interventions=("operands-and-result",),
                              n_per_template=2, few_shot=1)  # fmt: skip
    pairs = [p for p in generate_mediation_pairs(cfg) if p.template_id == "med-eq-1"]
    return tokenize_mediation_pairs(make_tiny_tokenizer(), pairs)[0]


def _pairs(items: list[Any]) -> list[tuple[int, int]]:
    return [(len(i.base_ids), int((i.base_ids != i.alt_ids).nonzero()[0])) for i in items]


@pytest.mark.parametrize("max_rows", [3, 256])
def test_mediation_work_is_planned(max_rows: int) -> None:
    view, items = _view(), _mediation_items()
    d = view.dims
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        mediation_effects(view, items, (0, 2), max_rows=max_rows)
        neuron_effects(view, items, 1, max_rows=max_rows * 10)
    sites = [layer for _ in COMPONENTS for layer in (0, 2)]
    token_layers, rows = mediation_cost(d.n_layers, sites, _pairs(items), max_rows)
    neuron_layers, neuron_rows = neuron_cost(d.n_layers, 1, view.mlp(0).up_proj.out_features, _pairs(items),
                                             max_rows * 10)  # fmt: skip
    assert sum(seen) == token_layers + neuron_layers
    assert work.macs == sum(seen) * _c_layer(view) + (rows + neuron_rows) * d.d_vocab * d.d_model


class _Counter:
    """A progress bar that only counts (arithmech.progress.Progress)."""

    def __init__(self) -> None:
        self.total: float | None = None
        self.done = 0.0

    def update(self, n: float | None = 1) -> None:
        self.done += n or 0


def _circuit_chunks(batch: CircuitBatch, batch_size: int) -> list[tuple[int, int, int]]:
    return [(len(c), int(c.clean_ids.shape[1]), c.shared_positions) for c in batch.chunks(batch_size)]


@pytest.mark.parametrize("arch", ["llama", "llama-mqa"])
@pytest.mark.parametrize(("method", "shared"), [("eap", 0), ("eap-ig", 3)])
def test_edge_attribution_work_is_planned(arch: str, method: str, shared: int) -> None:
    """Forward work counted; the backward (input gradients of the same layers) is planned as much again."""
    view = tiny_view(arch)
    d = view.dims
    graph = CircuitGraph.from_dims(d)
    batch = shared_start_batch(shared) if shared else tiny_batch()
    bar = _Counter()
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        edge_scores(view, graph, batch, method=method, steps=3, batch_size=2, progress=bar)
    points = len(interpolation_points(method, 3))
    plain, gradient = edge_attribution_token_layers(d.n_layers, _circuit_chunks(batch, 2), points)
    assert sum(seen) == plain + gradient
    c_attn, c_mlp = layer_macs(d.d_model, d.n_heads, d.n_kv_heads, d.d_head, view.mlp(0).up_proj.out_features)
    assert work.macs == plain * (c_attn + c_mlp) + gradient * (c_mlp + d.n_heads // d.n_kv_heads * c_attn)
    assert bar.total == bar.done == len(batch.chunks(2)) * points


def test_faithfulness_sweep_runs_are_planned() -> None:
    """The circuits run, as the engine counts them; the plain runs' and rows' token-layers bound the counted ones
    from below (the rows' deviating head inputs are normed on top, as many as the circuit's edges ask)."""
    view = tiny_view("llama")
    graph = CircuitGraph.from_dims(view.dims)
    batch = shared_start_batch(3)
    scores = random_scores(graph, 0)
    bar = _Counter()
    percents = (0.0, 10.0, 50.0, 100.0)
    with count_layer_tokens(view) as seen:
        faithfulness_sweep(view, graph, batch, scores, percents, batch_size=2, circuits_per_pass=2,
                           progress=bar)  # fmt: skip
    circuits = {tuple(top_edges(graph, scores, k, absolute).flatten().tolist()) for absolute in (False, True)
                for k in percents[:-1]}  # fmt: skip
    distinct = len(circuits)  # 100 % is the clean run
    assert distinct <= sweep_circuits(percents)  # the planner's count: signed and absolute apart
    assert bar.total == bar.done == sweep_runs(len(batch.chunks(2)), distinct, mean_ablation=False)
    planned = sweep_token_layers(view.dims.n_layers, _circuit_chunks(batch, 2), distinct, 2, mean_ablation=False)
    assert planned <= sum(seen) <= 1.5 * planned


def test_attribution_patching_work_is_planned() -> None:
    view = _view()
    batch = _batch(view, LENGTHS)
    with count_layer_tokens(view) as seen:
        attribution_patch(view, batch, "total", batch_size=4)
    chunks = [(len(c), int(c.ref_ids.shape[1])) for c in (batch.select(slice(0, 4)), batch.select(slice(4, 6)))]
    forward, _ = attribution_token_layers(view.dims.n_layers, chunks)
    assert sum(seen) == forward


@pytest.mark.parametrize("ablation", ["mean", "zero"])
def test_transfer_target_work_is_planned(ablation: str) -> None:
    """One generated target prepared and scored as the transfer stage does: the candidates' filtering run, the
    ablation values and the knockout of the kept prompts (stages/transfer_config.target_cost)."""
    from arithmech.data import tokenize_pairs
    from arithmech.data.heldout import Exclusion
    from arithmech.data.target_sets import build_target_pairs, target_set
    from arithmech.models.load import ModelHandle
    from arithmech.stages.transfer import SourcePlan, score_target
    from arithmech.stages.transfer_config import TransferConfig, target_cost
    from arithmech.stages.transfer_targets import prepare_target

    model = make_tiny_model("llama", seed=0)
    view = ModelView(model, spec_for_model_type("llama"))
    handle = ModelHandle(model, make_tiny_tokenizer(), view, {"model": "tiny"})
    cfg = TransferConfig(sources=("run",), targets=("addition",), ablation=ablation, max_prompts=3, n_per_template=1,
                         few_shot=1, filter_correct=False, batch_size=4, n_random=2)  # fmt: skip
    effect = [Component(1, 0), Component(2, 1)]
    randoms = [[Component(0, 2), Component(2, 0)], [Component(2, 3), Component(1, 1)]]
    plan = SourcePlan("run", "addition", effect, randoms, {}, "", Exclusion.of([]))
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        target = prepare_target(handle, "addition", cfg)
        score_target(handle, target, [plan], cfg)
    pairs = build_target_pairs(target_set("addition"), cfg.target_options())
    t, _ = tokenize_pairs(handle.tokenizer, pairs, first_token_answers=False, counterfactual_required=True,
                          answer_digits=True, one_digit_tokens=False)  # fmt: skip
    assert target.batch is not None
    first = [view.dims.n_layers] + [min(c.layer for c in config) for config in (effect, *randoms)]
    cost = target_cost(view.dims.n_layers, first, (t.end + 1).tolist(), (target.batch.end + 1).tolist(),
                       cfg.batch_size, ablation != "zero")  # fmt: skip
    knock = cost.knockout
    assert sum(seen) == cost.plain_token_layers + knock.intact_token_layers + knock.row_token_layers
    d = view.dims
    rows = cost.plain_rows + knock.end_rows
    assert work.macs == sum(seen) * _c_layer(view) + rows * d.d_vocab * d.d_model


def test_head_importance_work_is_planned() -> None:
    """neurons' head importance on two operations' prompts, every head zeroed alone (plan/stage_work.py)."""
    from arithmech.neurons.importance import head_importance
    from arithmech.plan.stage_work import importance_cost

    view = _view()
    d = view.dims
    sets = {"addition": _batch(view, LENGTHS), "subtraction": _batch(view, LENGTHS[:4])}
    heads = [c for c in all_components(d) if c.head is not None]
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        head_importance(view, sets, heads, batch_size=5)
    token_layers = rows = 0
    for batch in sets.values():
        predict, cost = importance_cost(d.n_layers, [c.layer for c in heads], (batch.end + 1).tolist(), 5)
        token_layers += predict + cost.intact_token_layers + cost.row_token_layers
        rows += len(batch) + cost.end_rows
    assert sum(seen) == token_layers
    assert work.macs == sum(seen) * _c_layer(view) + rows * d.d_vocab * d.d_model


def _handle() -> Any:
    from arithmech.models.load import ModelHandle

    model = make_tiny_model("llama", seed=0)
    return ModelHandle(model, make_tiny_tokenizer(), ModelView(model, spec_for_model_type("llama")), {"model": "tiny"})


def _macs(view: ModelView, cost: Any) -> int:
    d = view.dims
    c_attn, c_mlp = layer_macs(d.d_model, d.n_heads, d.n_kv_heads, d.d_head, view.mlp(0).up_proj.out_features)
    return cost.token_layers * (c_attn + c_mlp) + cost.mlp_rows * c_mlp + cost.readout_rows * d.d_vocab * d.d_model


@pytest.mark.parametrize("end_only", [True, False])
def test_agreement_zero_ablation_work_is_planned(end_only: bool) -> None:
    """agreement's zero ablation at the last token (decoding steps with the whole vocabulary read out) or at every
    position (knockout_scores of each component and attention layer), plan/analysis_work.py."""
    from arithmech.plan.analysis_work import Cost, zero_all_cost, zero_end_cost
    from arithmech.stages.agreement import _zero_ablation

    handle = _handle()
    view, d = handle.view, handle.dims
    batch = _batch(view, LENGTHS)
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        _zero_ablation(handle, batch, all_components(d), 5, end_only)
    if end_only:
        cost = zero_end_cost(d.n_layers, d.n_heads, LENGTHS)
    else:
        knock = zero_all_cost(d.n_layers, d.n_heads, LENGTHS, 5)
        cost = Cost(knock.intact_token_layers + knock.row_token_layers, 0, knock.end_rows)
    assert sum(seen) == cost.token_layers
    assert work.macs == _macs(view, cost)


def test_agreement_mediation_work_is_planned() -> None:
    from arithmech.plan.analysis_work import mediation_end_cost
    from arithmech.stages.agreement import _mediation_at_end

    handle = _handle()
    view = handle.view
    batch = _batch(view, LENGTHS)
    moved = view.end_logits(batch.cf_ids, batch.cf_mask, batch.end).argmax(-1) != batch.answer_ids
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        _mediation_at_end(handle, batch)
    pairs = [(n, 2) for n, kept in zip(LENGTHS, moved.tolist(), strict=True) if kept]  # cf differs at position 2
    assert pairs, "the tiny model must move some answers for the check to mean anything"
    cost = mediation_end_cost(view.dims.n_layers, LENGTHS, pairs)
    assert sum(seen) == cost.token_layers
    assert work.macs == _macs(view, cost)


def _identify_prompts(monkeypatch: pytest.MonkeyPatch, stage: Any, handle: Any, tmp_path: Any) -> Any:
    """The stage reads `addition` target pairs as an identify run's reference prompts; their tokenization."""
    from arithmech.data import tokenize_pairs
    from arithmech.data.target_sets import build_target_pairs, target_set
    from arithmech.stages.identify_run import IdentifyRun
    from arithmech.stages.transfer_config import TransferConfig

    options = TransferConfig(sources=("run",), targets=("addition",), n_per_template=1, few_shot=1).target_options()
    pairs = build_target_pairs(target_set("addition"), options)[:7]
    run = IdentifyRun(tmp_path, {}, {}, pairs, {}, {})
    monkeypatch.setattr(stage, "read_identify_run", lambda *_a, **_k: run)
    return tokenize_pairs(handle.tokenizer, pairs)[0]


def test_analysis_stages_work_is_planned(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """analyze mlp and analyze fourier, run as stages on a tiny model (the identify run's prompts stood in), and
    analyze attention's engine on chunks of the same prompts cut after a chosen layer (plan/analysis_work.py)."""
    from arithmech.analysis.attention import end_attention
    from arithmech.plan.analysis_work import attention_cost, fourier_cost, mlp_lens_cost
    from arithmech.stages import analyze_mlp, fourier
    from arithmech.stages.analyze_mlp_config import AnalyzeMlpConfig
    from arithmech.stages.fourier_config import FourierConfig

    handle = _handle()
    view, d = handle.view, handle.dims
    t = _identify_prompts(monkeypatch, analyze_mlp, handle, tmp_path)
    _identify_prompts(monkeypatch, fourier, handle, tmp_path)
    widths = (t.end + 1).tolist()
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        analyze_mlp.analyze_mlp(handle, AnalyzeMlpConfig(batch_size=3), tmp_path / "run", tmp_path / "mlp", quiet=True)
    cost = mlp_lens_cost(d.n_layers, widths, 3)
    assert (sum(seen), work.macs) == (cost.token_layers, _macs(view, cost))

    cfg = FourierConfig(batch_size=3, cutoffs=(1, 2))
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        result = fourier.analyze_fourier(handle, cfg, tmp_path / "run", tmp_path / "fourier", quiet=True)
    kept = result.metadata["counts"]["prompts"]
    assert kept == len(widths), "every prompt kept, so the widths are those planned"
    cost = fourier_cost(d.n_layers, widths, 3, len(cfg.filter_plan(10)))
    assert (sum(seen), work.macs) == (cost.token_layers, _macs(view, cost))

    with count_layer_tokens(view) as seen:
        end_attention(view, t.ref_ids, t.ref_mask, t.end, [0, 1], batch_size=3)
    assert sum(seen) == attention_cost(1, widths, 3).token_layers


def test_heuristics_work_is_planned(tmp_path: Any) -> None:
    """The heuristics stage on two operations' operand grids: scan_neurons, then ablation_sweep on the shared
    few-shot prefix, each prompt's query and one END row per (configuration, prompt) (plan/analysis_work.py)."""
    from arithmech.data import tokenize_pairs
    from arithmech.data.operand_grid import operand_grid
    from arithmech.data.templates import load_templates, select_templates
    from arithmech.models.shared_prefix import common_prefix_length
    from arithmech.plan.analysis_work import Cost, heuristics_cost
    from arithmech.stages.heuristics import heuristics
    from arithmech.stages.heuristics_config import HeuristicsConfig

    handle = _handle()
    view, d = handle.view, handle.dims
    cfg = HeuristicsConfig(operations=("addition", "subtraction"), grid_size=10, few_shot=1, max_pairs=7,
                           filter_correct=False, ks=(1, 2), n_random=1, batch_size=5)  # fmt: skip
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        heuristics(handle, cfg, tmp_path / "h", quiet=True)
    configurations = cfg.sweep_configurations(cfg.ks or ())
    cost, prompts = Cost(), 0
    for operation in cfg.operations:
        template = select_templates(load_templates(), (operation,), (cfg.formation,))[0]
        grid = operand_grid(template, 10, 10, cfg.few_shot, cfg.max_pairs, cfg.seed)
        t, _ = tokenize_pairs(handle.tokenizer, grid.pairs, counterfactual_required=False)
        prefix = common_prefix_length(t.ref_ids, t.end)
        cost = cost + heuristics_cost(d.n_layers, (t.end + 1).tolist(), prefix, configurations, cfg.batch_size)
        prompts += len(t.end)
    # the scan's END readout multiplies the unembedding's weight itself (neurons/log_increase.log_probs), which
    # the module's hook does not see: planned, not counted
    unseen = prompts * d.d_vocab * d.d_model
    assert (sum(seen), work.macs + unseen) == (cost.token_layers, _macs(view, cost))


def test_neurons_later_steps_work_is_planned() -> None:
    """neurons' steps 2-4 as the stage calls them: comparative neurons and attention LI, a pruning sweep, LoRA
    training and the coefficient change (plan/stage_work.py). Counted: the layers' forward work and readouts
    through the unembedding module; the readouts by its weight (LI) and LoRA's backward are planned beside."""
    from arithmech.neurons import (
        LoraTrainConfig,
        attention_li,
        coefficient_change,
        comparative_neurons,
        pruning_sweep,
        train_layer_lora,
    )
    from arithmech.neurons.log_increase import DEFAULT_MAX_ELEMENTS
    from arithmech.plan.analysis_plans import LI_BLOCK_ELEMENTS
    from arithmech.plan.stage_work import comparative_cost, lora_cost, pruning_cost

    assert LI_BLOCK_ELEMENTS == DEFAULT_MAX_ELEMENTS  # the planned block of LI logits is the engine's

    handle = _handle()
    view, d = handle.view, handle.dims
    batch = _batch(view, LENGTHS)
    c_layer = _c_layer(view)
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        comparative_neurons(view, batch, Component(1, 0), [1, 2])
        attention_li(view, batch, range(d.n_layers))
    token_layers, _ = comparative_cost(d.n_layers, view.mlp(0).up_proj.out_features, 2, LENGTHS)
    assert sum(seen) == token_layers and work.macs == token_layers * c_layer  # LI reads by the weight

    scores = torch.rand(2, view.mlp(0).up_proj.out_features)
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        pruning_sweep(view, batch.ref_ids, batch.ref_mask, batch.end, batch.answer_ids, scores, [1, 2], (3, 5),
                      n_random=1, batch_size=4)  # fmt: skip
    token_layers, rows = pruning_cost(d.n_layers, 1, 2 * (1 + 1), LENGTHS, 4)
    assert sum(seen) == token_layers
    assert work.macs == token_layers * c_layer + rows * d.d_vocab * d.d_model

    cfg = LoraTrainConfig(layers=(1,), rank=2, steps=3, batch_size=8)  # every prompt each step, as the stage's 16
    with count_layer_tokens(view) as seen, count_work(view.model) as work:
        adapter = train_layer_lora(handle, batch.ref_ids, batch.ref_mask, batch.end, batch.answer_ids, cfg)
        coefficient_change(handle, adapter, batch.ref_ids, batch.ref_mask, batch.end, [(1, 3), (2, 4)],
                           answer_ids=batch.answer_ids)  # fmt: skip
    forward, _, _ = lora_cost(d.n_layers, 1, 3, len(LENGTHS), len(LENGTHS), max(LENGTHS), 2)
    assert sum(seen) == forward
    assert work.macs == forward * c_layer + 3 * len(LENGTHS) * d.d_vocab * d.d_model  # the steps' END logits
