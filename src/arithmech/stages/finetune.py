"""The finetune stage: precise SFT of the key heads (paper sec. 4.3), or the full-SFT / LoRA baselines.

Selection (precise): the top-k heads by path-patching effect of an identify run (`from_run`, `top_k`), or the
heads named in `components` (MLPs named there, in `mlps`, or the run's `top_mlps`, are trained whole). The
paper's H / h_l acts on the slices' gradients by default (`head_scale`); under AdamW that changes little, and
`head_scale: learning-rate` puts it on their learning rate instead (finetune/head_slices.py). Data,
schedule and hyperparameters are the same for every method (finetune/train.py). Runs under `accelerate launch`
as it is: every process calls `finetune`, the main one writes the files.

Writes into the output folder (atomically, metadata.json last):
    delta.safetensors, delta.json   what changed (finetune/delta.py); `apply_delta(base_model, folder)`
    merged/                         with `save_merged`: the whole trained model and tokenizer (HF format)
    lora_adapter/                   for LoRA: the adapter in peft's format
    train_log.csv                   per optimizer step: step, epoch, lr, loss, grad_norm (empty without
                                    clipping), tokens, seconds
    split.json                      with `data: arithmetic`: the train/test split its prompts came from
    metadata.json                   selection (heads, MLPs, H/h_l per layer and its form, K/V groups), counts,
                                    trainable and total parameters, samples/second, peak memory, timings, versions
Checkpoints live in checkpoints/ while training and are removed once the outputs are written.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from arithmech.data.locate import data_sha256
from arithmech.data.tokens import pad_id_of
from arithmech.errors import ConfigError
from arithmech.finetune.arithmetic_data import arithmetic_examples
from arithmech.finetune.checkpoint import remove_checkpoints
from arithmech.finetune.data import TokenizedExample, tokenize_examples
from arithmech.finetune.delta import atomic_folder, save_delta, save_merged
from arithmech.finetune.methods import make_trainable, requires_grad_state, restore_requires_grad, total_parameters
from arithmech.finetune.sft_rows import ARITHMETIC, read_sft_examples, resolve_sft_data
from arithmech.finetune.train import TrainResult, accelerator_for, diverged, train
from arithmech.lineage import identify_folder, identify_record
from arithmech.models.context import context_length
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, parse_component
from arithmech.runs import atomic_write_json, atomic_write_text, csv_text, git_sha, package_versions
from arithmech.stages.finetune_config import FinetuneConfig
from arithmech.stages.identify_run import read_identify_run

logger = logging.getLogger(__name__)

# Settings that may differ between an interrupted run and its resumption.
LOG_FIELDS = ("step", "epoch", "lr", "loss", "grad_norm", "tokens", "seconds")
"""Columns of train_log.csv: one row per optimizer step."""
_NOT_FINGERPRINTED = ("resume", "stop_after", "checkpoint_every", "save_merged")


@dataclass
class FinetuneResult:
    out_dir: Path
    train: TrainResult
    selection: dict[str, Any]
    metadata: dict[str, Any]


def select_components(handle: ModelHandle, cfg: FinetuneConfig) -> tuple[list[Component], list[int]]:
    """(heads, MLP layers) that precise SFT trains."""
    dims = handle.dims
    run = read_identify_run(cfg.from_run, handle) if cfg.from_run else None
    if cfg.components:
        chosen = [parse_component(name, dims) for name in cfg.components]
    else:
        assert run is not None
        n_heads = dims.n_layers * dims.n_heads
        if cfg.top_k > n_heads:
            raise ConfigError(f"top_k {cfg.top_k} is larger than the {n_heads} heads of the model; lower --top-k")
        chosen = run.ranked("head")[: cfg.top_k]
    mlps = [c.layer for c in chosen if c.head is None]
    for name in cfg.mlps:
        mlps.append(parse_component(name if "mlp" in name else f"mlp.{name.strip()}", dims).layer)
    if cfg.top_mlps:
        assert run is not None
        mlps += [c.layer for c in run.ranked("mlp")[: cfg.top_mlps]]
    heads = [c for c in chosen if c.head is not None]
    if not heads and not mlps:
        raise ConfigError("the selection has no heads and no MLPs; name some with --components or --mlps")
    return heads, sorted(set(mlps))


def finetune(handle: ModelHandle, cfg: FinetuneConfig, out_dir: str | Path, quiet: bool = False) -> FinetuneResult:
    """Train with `cfg.method`, write the delta (and merged model) and metadata; return the result."""
    out = Path(out_dir)
    start = time.perf_counter()
    if handle.source.get("device") == "auto":
        raise ConfigError("finetune needs the whole model on one device per process; use --device cpu or cuda")
    if cfg.lr_warning():
        logger.warning("%s", cfg.lr_warning())
    precise = cfg.method == "precise"
    identify_run = identify_record(identify_folder(cfg.from_run)) if precise and cfg.from_run else None
    heads, mlps = select_components(handle, cfg) if precise else ([], [])
    data, data_record = _training_data(handle, cfg)
    split = data_record.pop("split", None)
    accelerator = accelerator_for(handle.device)
    handle.model.to(accelerator.device)
    flags = requires_grad_state(handle.model)
    lora = {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "dropout": cfg.lora_dropout, "seed": cfg.seed}
    trainable = make_trainable(cfg.method, handle.view, heads, mlps, cfg.head_scale, lora)
    selection = trainable.summary()
    config = {k: v for k, v in asdict(cfg).items() if k not in _NOT_FINGERPRINTED}
    read = {"identify_run": identify_run["fingerprint"]} if identify_run else {}  # its heads are trained
    fingerprint = json.loads(json.dumps({"config": config, "model": handle.source.get("gguf_sha256")
                                         or handle.source.get("model"), "examples": len(data), **read}, default=str))
    if accelerator.is_main_process and not cfg.resume:  # a fresh run: no stale result or checkpoint
        (out / "metadata.json").unlink(missing_ok=True)
        remove_checkpoints(out)
    accelerator.wait_for_everyone()
    result = train(accelerator, trainable, data, pad_id_of(handle.tokenizer), cfg, out, fingerprint, quiet)
    if diverged(result.log):
        first, last = result.log[0], result.log[-1]
        logger.warning("the training loss rose from %.3g (step 1) to %.3g (step %d): training diverged; lower --lr "
                       "(now %g) and train again", first["loss"], last["loss"], last["step"], cfg.lr)  # fmt: skip
    metadata: dict[str, Any] = {}
    if result.finished:
        if accelerator.is_main_process and cfg.method == "lora":
            with atomic_folder(out / "lora_adapter") as staging:
                trainable.save_native(staging)
        entries = trainable.finish()
        restore_requires_grad(handle.model, flags)
        metadata = _metadata(handle, cfg, result, selection, data_record, start)
        metadata["identify_runs"] = [] if identify_run is None else [identify_run]
        if accelerator.is_main_process:
            save_delta(entries, out, {"base_model": handle.source, "method": cfg.method, "selection": selection})
            if cfg.save_merged:
                save_merged(handle.model, handle.tokenizer, out / "merged")
            atomic_write_text(out / "train_log.csv", csv_text(result.log, LOG_FIELDS))
            if split is not None:
                atomic_write_json(out / "split.json", split)
            atomic_write_json(out / "metadata.json", metadata)
            remove_checkpoints(out)
        accelerator.wait_for_everyone()
    else:
        restore_requires_grad(handle.model, flags)
    handle.model.eval()
    return FinetuneResult(out, result, selection, metadata)


def _max_length(handle: ModelHandle, cfg: FinetuneConfig) -> int:
    """cfg.max_length, or the model's context length where that is shorter: an example longer than the context
    cannot be trained on (GPT-2's learned positions end there), so it is dropped like any too-long one."""
    context = context_length(handle.model)
    if context is None or context >= cfg.max_length:
        return cfg.max_length
    logger.info("max_length %d is longer than the model's context; examples over %d tokens are dropped",
                cfg.max_length, context)  # fmt: skip
    return context


def _training_data(handle: ModelHandle, cfg: FinetuneConfig) -> tuple[list[TokenizedExample], dict[str, Any]]:
    """The tokenized examples, and what metadata.json records of them (arithmetic: also its split); max_length is
    the limit applied: cfg.max_length, or the model's context where that is shorter."""
    return training_data(handle.tokenizer, cfg, _max_length(handle, cfg))


def training_data(
    tokenizer: Any, cfg: FinetuneConfig, max_length: int
) -> tuple[list[TokenizedExample], dict[str, Any]]:
    """`_training_data` with a tokenizer alone: the memory budget reads the widest example before the weights
    load (plan/budget.py), at cfg.max_length, which no example the stage keeps exceeds."""
    if cfg.data == ARITHMETIC:
        data, record = arithmetic_examples(tokenizer, cfg.operations, cfg.max_samples, cfg.split_seed, cfg.seed,
                                           max_length)  # fmt: skip
        return data, {**record, "max_length": max_length}
    path = resolve_sft_data(cfg.data, cfg.data_dir)
    examples, read_counts = read_sft_examples(path, cfg.target)
    if cfg.max_samples is not None and cfg.max_samples < len(examples):
        examples = random.Random(cfg.seed).sample(examples, cfg.max_samples)
    data, tok_counts = tokenize_examples(tokenizer, examples, max_length, cfg.chat_template)
    return data, {"path": str(path), "sha256": data_sha256(path), **read_counts, **tok_counts, "max_length": max_length}


def _metadata(
    handle: ModelHandle,
    cfg: FinetuneConfig,
    result: TrainResult,
    selection: dict[str, Any],
    data: dict[str, Any],
    start: float,
) -> dict[str, Any]:
    total = total_parameters(handle.model)
    trainable = int(selection["trainable_parameters"])
    return {
        "stage": cfg.STAGE,
        "method": cfg.method,
        "model": handle.source,
        "dims": asdict(handle.dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "selection": selection,
        "data": data,
        "counts": {"steps": result.steps, "total_steps": result.total_steps, "examples_per_step": cfg.batch_size},
        "trainable_parameters": trainable,
        "total_parameters": total,
        "trainable_fraction": trainable / total,
        "samples_per_second": result.samples_per_second,
        "peak_memory": result.peak_memory,
        "final_loss": result.log[-1]["loss"] if result.log else None,
        "distributed": {"type": result.distributed_type, "processes": result.world_size},
        "resumed_from_step": result.resumed_from,
        "timings": {"train_s": result.train_seconds, "finetune_s": time.perf_counter() - start},
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }

