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
    train_log.csv                   per optimizer step: step, epoch, lr, loss, grad_norm, tokens, seconds
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arithmech.data.locate import data_sha256
from arithmech.data.templates import OPERATIONS
from arithmech.data.tokens import pad_id_of
from arithmech.errors import ConfigError
from arithmech.finetune.arithmetic_data import ARITHMETIC, arithmetic_examples
from arithmech.finetune.checkpoint import remove_checkpoints
from arithmech.finetune.data import TARGETS, TokenizedExample, read_sft_examples, resolve_sft_data, tokenize_examples
from arithmech.finetune.delta import atomic_folder, save_delta, save_merged
from arithmech.finetune.head_slices import HEAD_SCALES
from arithmech.finetune.methods import (
    METHODS,
    make_trainable,
    requires_grad_state,
    restore_requires_grad,
    total_parameters,
)
from arithmech.finetune.train import TrainConfig, TrainResult, accelerator_for, train
from arithmech.lineage import identify_folder, identify_record
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, parse_component
from arithmech.runs import atomic_write_json, atomic_write_text, csv_text, git_sha, package_versions
from arithmech.stages.identify_run import read_identify_run

logger = logging.getLogger(__name__)

# Settings that may differ between an interrupted run and its resumption.
LOG_FIELDS = ("step", "epoch", "lr", "loss", "grad_norm", "tokens", "seconds")
"""Columns of train_log.csv: one row per optimizer step."""
_NOT_FINGERPRINTED = ("resume", "stop_after", "checkpoint_every", "save_merged")


@dataclass(frozen=True)
class FinetuneConfig(TrainConfig):
    """Settings of the finetune stage: the optimisation settings of TrainConfig plus what and on what to train."""

    method: str = field(default="precise", metadata={"help": "precise (key heads), full (every parameter) or lora"})
    from_run: str | None = field(default=None, metadata={"help": "identify run folder: its top-k heads by effect"})
    components: tuple[str, ...] | None = field(
        default=None, metadata={"help": "heads (14.2) and MLPs (mlp.20) to train, instead of the run's top-k"}
    )
    top_k: int = field(default=32, metadata={"help": "heads taken from the identify run, most negative effect first"})
    mlps: tuple[str, ...] = field(default=(), metadata={"help": "MLP layers trained whole as well (mlp.20 or 20)"})
    top_mlps: int = field(default=0, metadata={"help": "also train the run's top MLPs by effect (paper: 3 is best)"})
    head_scale: str = field(
        default="gradient",
        metadata={"help": "H / h_l (heads per layer / selected there) on a layer's head slices: gradient (paper; "
                          "under AdamW nearly a no-op, Adam divides a constant gradient scale out), learning-rate "
                          "(their lr times H / h_l: the form that changes AdamW's steps) or none"},
    )  # fmt: skip
    data: str = field(
        default="llm_adapters_math_v1",
        metadata={"help": "llm_adapters_math_v1, gsm8k (shipped train splits), a JSONL path, or arithmetic (train "
                          "part of the template split: answer targets, plain few-shot prompts, no chat template)"},
    )
    operations: tuple[str, ...] = field(
        default=OPERATIONS, metadata={"help": "arithmetic data: the operations of its prompts (e.g. subtraction)"}
    )
    split_seed: int = field(
        default=0, metadata={"help": "arithmetic data: seed of the train/test split; evaluate with the same one"}
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "folder holding the data sets (default $ARITHMECH_DATA, then shipped)"}
    )
    target: str = field(default="rationale", metadata={"help": "rationale (correct ones only) or answer"})
    max_samples: int | None = field(
        default=None,
        metadata={"help": "use at most this many rows (seeded sample); arithmetic: this many prompts (default one per "
                          "train template and operand pair)"},
    )  # fmt: skip
    max_length: int = field(default=512, metadata={"help": "drop examples longer than this many tokens"})
    chat_template: bool = field(default=True, metadata={"help": "use the tokenizer's chat template when it has one"})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank"})
    lora_alpha: float = field(default=16.0, metadata={"help": "LoRA alpha (scale alpha / r)"})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout"})
    save_merged: bool = field(default=False, metadata={"help": "also save the whole trained model in HF format"})

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("components", "mlps", "operations"):
            value = getattr(self, name)
            if isinstance(value, list | str):
                object.__setattr__(self, name, tuple(value.split(",") if isinstance(value, str) else value))
        if not self.operations or any(op not in OPERATIONS for op in self.operations):
            raise ConfigError(f"operations must be drawn from {', '.join(OPERATIONS)}; got {self.operations!r}")
        if self.method not in METHODS:
            raise ConfigError(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.head_scale not in HEAD_SCALES:
            raise ConfigError(f"head_scale {self.head_scale!r} is not one of {', '.join(HEAD_SCALES)}")
        if self.target not in TARGETS:
            raise ConfigError(f"target {self.target!r} is not one of {', '.join(TARGETS)}")
        if self.method == "precise" and self.from_run is None and not self.components and not self.mlps:
            raise ConfigError(
                "precise SFT needs heads: give --from RUN_DIR (its top-k heads) or --components 14.2,18.5"
            )
        if self.top_mlps and self.from_run is None:
            raise ConfigError("top_mlps ranks MLPs by an identify run; give --from RUN_DIR or name them in --mlps")
        for name in ("top_k", "lora_r", "max_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.top_mlps < 0 or self.max_samples is not None and self.max_samples < 1:
            raise ConfigError("top_mlps must be 0 or more and max_samples at least 1")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout must be in [0, 1) (got {self.lora_dropout})")


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
    metadata: dict[str, Any] = {}
    if result.finished:
        if accelerator.is_main_process and cfg.method == "lora":
            with atomic_folder(out / "lora_adapter") as staging:
                trainable.save_native(staging)
        entries = trainable.finish()
        restore_requires_grad(handle.model, flags)
        metadata = _metadata(handle, cfg, result, selection, data_record, start)
        metadata["identify_run"] = identify_run
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


def _training_data(handle: ModelHandle, cfg: FinetuneConfig) -> tuple[list[TokenizedExample], dict[str, Any]]:
    """The tokenized examples, and what metadata.json records of them (arithmetic: also its split)."""
    if cfg.data == ARITHMETIC:
        return arithmetic_examples(handle.tokenizer, cfg.operations, cfg.max_samples, cfg.split_seed, cfg.seed,
                                   cfg.max_length)  # fmt: skip
    path = resolve_sft_data(cfg.data, cfg.data_dir)
    examples, read_counts = read_sft_examples(path, cfg.target)
    if cfg.max_samples is not None and cfg.max_samples < len(examples):
        examples = random.Random(cfg.seed).sample(examples, cfg.max_samples)
    data, tok_counts = tokenize_examples(handle.tokenizer, examples, cfg.max_length, cfg.chat_template)
    return data, {"path": str(path), "sha256": data_sha256(path), **read_counts, **tok_counts}


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
        "stage": "finetune",
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

