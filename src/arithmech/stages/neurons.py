"""The neurons stage: comparative neuron analysis (Yu & Ananiadou 2024) on one model, into one folder.

Steps (METHODS.md sec. 6; the engines are in `arithmech/neurons/`):
1. head importance: every head zeroed in turn, on a prompt set per operation (generated and filtered as
   identify does); the drop of P(original top token) and of accuracy, and which heads carry which operation;
2. comparative neurons: for the key head (default: the head with the largest drop on the first operation) the
   LI of every FFN neuron of the deep layers with the model intact and with that head zeroed, the CNA score
   (their difference), and for the top neurons their coefficients, LIs and value-vector tokens; plus the LI
   of every attention layer;
3. pruning: keep only the top-CNA (or top-LI) neurons of the deep layers vs the same number of random ones,
   scored on held-out prompts of the same operation (answered, not among those that ranked the neurons) and,
   for comparison, on the ranking prompts themselves (the `prompts` column of pruning.csv);
4. LoRA: train a LoRA adapter on one layer's MLP (or load the user's peft folder) and report how it moves the
   coefficients (and LIs) of the top neurons.

Each step's result is saved under <out>/.partial/ (keyed by model, settings and code version) as soon as it is
done, so an interrupted run restarts at the step that did not finish. Writes head_importance.csv, specialisation.json,
head_importance.png, attention_li.csv, cna_neurons.csv, pruning.csv, pruning.png, lora_coefficients.csv
(and lora_adapter/ when trained here), then metadata.json last. An undefined number is an empty cell (a mean
or spread over too few prompts in pruning.csv, a coefficient ratio over a zero coefficient in
lora_coefficients.csv), or null (share_of_drop of an operation whose heads lower nothing, specialisation.json).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech.errors import ConfigError
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, parse_component
from arithmech.runs import (
    atomic_open,
    atomic_write_json,
    atomic_write_text,
    code_version,
    csv_text,
    defined,
    defined_row,
    git_sha,
    package_versions,
)
from arithmech.stages.identify_run import model_identity
from arithmech.stages.neurons_config import LORA_BATCH, NeuronsConfig


@dataclass
class NeuronsResult:
    """What the stage found; the report reads the same numbers from the files."""

    importance: Any  # neurons.importance.HeadImportance
    specialisation: Any  # neurons.importance.Specialisation
    head: Component
    layers: tuple[int, ...]
    neurons: list[Any]  # neurons.comparative.NeuronReport
    attention_li: torch.Tensor  # [layer] mean LI of each attention layer on the CNA operation's prompts
    pruning: dict[str, Any]
    """neurons.pruning.PruningResult on the held-out prompts (if the model answers enough) and on the ranking ones."""
    lora: Any | None  # neurons.lora_effect.CoefficientChange
    out_dir: Path
    metadata: dict[str, Any]


def _default_layers(n_layers: int) -> tuple[int, ...]:
    return tuple(range(n_layers - max(1, n_layers // 3), n_layers))


class _Steps:
    """Finished steps saved under .partial/<key>-<step>.pt, so a rerun skips them."""

    def __init__(self, out: Path, key: str) -> None:
        self.folder, self.key = out / ".partial", key

    def run(self, name: str, compute: Callable[[], Any]) -> Any:
        path = self.folder / f"{self.key}-{name}.pt"
        if path.is_file():
            return torch.load(path, weights_only=False)
        value = compute()
        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "wb") as handle:
            torch.save(value, handle)
        return value


@torch.no_grad()
def neurons(handle: ModelHandle, cfg: NeuronsConfig, out_dir: str | Path, quiet: bool = False) -> NeuronsResult:
    """Head importance per operation, CNA of the key head, pruning and LoRA analysis; writes the folder."""
    from tqdm.auto import tqdm

    from arithmech.neurons import (
        attention_li,
        comparative_neurons,
        head_importance,
        heldout_set,
        operation_sets,
        pruning_sweep,
        specialised_heads,
        top_neurons_report,
    )

    out = Path(out_dir)
    view, dims = handle.view, handle.dims
    layers = cfg.layers or _default_layers(dims.n_layers)
    bad = [layer for layer in (*layers, *(cfg.importance_layers or ())) if not 0 <= layer < dims.n_layers]
    if bad:
        raise ConfigError(f"layer {bad[0]} does not exist: the model has layers 0..{dims.n_layers - 1}")
    chosen_head = parse_component(cfg.head, dims) if cfg.head else None
    if chosen_head is not None and chosen_head.head is None:
        raise ConfigError(f"--head takes an attention head such as 14.2, not {cfg.head!r}")
    identity = [model_identity(handle.source), asdict(cfg), code_version()]  # steps of older code are not reused
    key = hashlib.sha256(json.dumps(identity, default=str).encode()).hexdigest()
    steps = _Steps(out, key[:16])
    timings: dict[str, float] = {}
    start = time.perf_counter()

    reference_cfg = cfg.reference_settings()
    sets, counts = operation_sets(handle, reference_cfg, cfg.operations)
    heads = [c for c in _components(dims) if cfg.importance_layers is None or c.layer in cfg.importance_layers]
    rows = sum(len(b) for b in sets.values()) * (len(heads) + 1)
    with tqdm(total=rows, desc="head importance", unit="row", disable=quiet) as bar:
        importance = steps.run("importance", lambda: head_importance(view, sets, heads, batch_size=cfg.batch_size,
                                                                     progress=bar.update))  # fmt: skip
    specialisation = specialised_heads(importance, top=min(cfg.top_heads, len(heads)))
    timings["importance_s"] = time.perf_counter() - start

    first = importance.operations[0]
    head = chosen_head or specialisation.top[first][0]
    batch = sets[first]
    mark = time.perf_counter()
    comparative = steps.run("comparative", lambda: comparative_neurons(view, batch, head, layers))
    top = top_neurons_report(view, handle.tokenizer, comparative, k=cfg.top_neurons, n_tokens=cfg.n_tokens)
    attention = steps.run("attention_li", lambda: attention_li(view, batch, range(dims.n_layers)).mean(0))
    timings["comparative_s"] = time.perf_counter() - mark

    mark = time.perf_counter()
    scores = (comparative.scores if cfg.prune_by == "cna" else comparative.li_intact).mean(0)  # [layer, d_mlp]
    heldout = heldout_set(handle, reference_cfg, first, cfg.max_prompts)
    prompt_sets = {"held-out": heldout, "ranking": batch} if heldout is not None else {"ranking": batch}
    n_configs = len(prompt_sets) * (1 + len(cfg.keep_sizes) * (1 + cfg.n_random))
    pruning: dict[str, Any] = {}
    with tqdm(total=n_configs, desc="pruning", unit="config", disable=quiet) as bar:
        for label, prompts in prompt_sets.items():
            pruning[label] = steps.run(f"pruning-{label}", lambda p=prompts: pruning_sweep(
                view, p.ref_ids, p.ref_mask, p.end, p.answer_ids, scores, layers, cfg.keep_sizes,
                selection=cfg.selection, n_random=cfg.n_random, seed=cfg.seed, batch_size=cfg.batch_size,
                progress=bar.update))  # fmt: skip
    timings["pruning_s"] = time.perf_counter() - mark

    lora = None
    lora_info: dict[str, Any] = {}
    if cfg.lora:
        mark = time.perf_counter()
        lora, lora_info = _lora(handle, cfg, batch, [(n.layer, n.neuron) for n in top], out, steps)
        timings["lora_s"] = time.perf_counter() - mark
    timings["neurons_s"] = time.perf_counter() - start
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "head": head.name,
        "layers": list(layers),
        "counts": {"prompts": importance.n_prompts, "generated": counts, "heads_scored": len(heads),
                   "pruning_prompts": {label: len(p) for label, p in prompt_sets.items()}},
        "lora": lora_info,
        "timings": timings,
        "versions": package_versions(),
        "identify_runs": [],  # it reads no identify run, so no rerun of one makes it stale
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    result = NeuronsResult(importance, specialisation, head, tuple(layers), top, attention, pruning, lora, out,
                           metadata)  # fmt: skip
    write_neurons_outputs(result, handle.source.get("model", "?"))
    shutil.rmtree(out / ".partial", ignore_errors=True)
    return result


def _components(dims: Any) -> list[Component]:
    from arithmech.models.sites import all_components

    return [c for c in all_components(dims) if c.head is not None]


def _lora(
    handle: ModelHandle, cfg: NeuronsConfig, batch: Any, neurons: list[tuple[int, int]], out: Path, steps: _Steps
) -> tuple[Any, dict[str, Any]]:
    """Coefficient change of the top neurons under a LoRA adapter (the user's, or one trained here)."""
    from arithmech.neurons import LoraTrainConfig, coefficient_change, train_layer_lora

    ids, mask, end, answers = batch.ref_ids, batch.ref_mask, batch.end, batch.answer_ids
    if cfg.adapter is not None:
        adapter: Any = cfg.adapter
        info: dict[str, Any] = {"adapter": cfg.adapter}
    else:
        layer = cfg.lora_layer if cfg.lora_layer is not None else Counter(n[0] for n in neurons).most_common(1)[0][0]
        if not 0 <= layer < handle.dims.n_layers:
            raise ConfigError(f"lora_layer {layer} does not exist: the model has layers 0..{handle.dims.n_layers - 1}")
        train_cfg = LoraTrainConfig(layers=(layer,), modules=("mlp",), rank=cfg.lora_rank, steps=cfg.lora_steps,
                                    batch_size=min(LORA_BATCH, len(batch)), seed=cfg.seed)  # fmt: skip
        adapter = steps.run("lora_adapter", lambda: train_layer_lora(handle, ids, mask, end, answers, train_cfg))
        adapter.save(out / "lora_adapter")
        info = {"trained_layer": layer, "modules": ["mlp"], "rank": cfg.lora_rank, "steps": cfg.lora_steps,
                "loss_first": adapter.losses[0] if adapter.losses else None,
                "loss_last": adapter.losses[-1] if adapter.losses else None}  # fmt: skip
    change = coefficient_change(handle, adapter, ids, mask, end, neurons, answer_ids=answers)
    return change, info


def write_neurons_outputs(result: NeuronsResult, model: str) -> None:
    """Every table and figure of the stage, then metadata.json."""
    from arithmech.report.neuron_plots import importance_heatmaps, pruning_curves

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    imp = result.importance
    rows = [
        {"operation": op, "component": c.name, "prob_drop": float(imp.prob_drop[i, j]),
         "accuracy_drop": float(imp.accuracy_drop[i, j])}
        for i, op in enumerate(imp.operations) for j, c in enumerate(imp.components)
    ]  # fmt: skip
    atomic_write_text(out / "head_importance.csv", _csv(rows))
    spec = result.specialisation
    atomic_write_json(out / "specialisation.json", {
        "top": {op: [h.name for h in hs] for op, hs in spec.top.items()},
        "share_of_drop": {op: defined(v) for op, v in spec.share.items()},
        "only_this_operation": {op: [h.name for h in hs] for op, hs in spec.only.items()},
        "shared_by_all": [h.name for h in spec.shared],
        "base_accuracy": dict(zip(imp.operations, imp.base_accuracy.tolist(), strict=True)),
        "base_prob": dict(zip(imp.operations, imp.base_prob.tolist(), strict=True)),
    })  # fmt: skip
    atomic_write_text(out / "attention_li.csv", _csv([
        {"layer": layer, "mean_li": float(v)} for layer, v in enumerate(result.attention_li.tolist())
    ]))  # fmt: skip
    atomic_write_text(out / "cna_neurons.csv", _csv([
        {"rank": r + 1, "neuron": f"{n.layer}_{n.neuron}", "layer": n.layer, "index": n.neuron, "cna": n.cna,
         "coef_intact": n.coeff_intact, "coef_zeroed": n.coeff_zeroed, "li_intact": n.li_intact,
         "li_zeroed": n.li_zeroed, "promoted_tokens": " | ".join(n.promoted_tokens),
         "top_tokens": " | ".join(n.top_tokens)}
        for r, n in enumerate(result.neurons)
    ]))  # fmt: skip
    pruning_rows = [{"prompts": label, **row} for label, sweep in result.pruning.items() for row in sweep.rows()]
    atomic_write_text(out / "pruning.csv", _csv(pruning_rows))
    if result.lora is not None:
        atomic_write_text(out / "lora_coefficients.csv", _csv(result.lora.rows()))
    n_prompts = sum(imp.n_prompts.values())
    importance_heatmaps(imp, result.metadata["dims"], out / "head_importance.png",
                        f"zero-ablation importance, {n_prompts} prompts: {model}")  # fmt: skip
    title = f"pruning layers {result.layers[0]}-{result.layers[-1]} by {result.metadata['config']['prune_by']}: {model}"
    pruning_curves(pruning_rows, out / "pruning.png", title)
    atomic_write_json(out / "metadata.json", result.metadata)


def _csv(rows: list[dict[str, Any]]) -> str:
    return csv_text([defined_row(row) for row in rows], float_format=".6g")
