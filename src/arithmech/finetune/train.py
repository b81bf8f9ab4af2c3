"""The training loop: one loop for every method, on Hugging Face accelerate, so it scales from one CPU to 8 GPUs.

Background
    Zhang et al. (2024, sec. 5.3) train with lr 2e-5, batch 128, 2 epochs, warm-up ratio 0.02 and weight decay 0.1
    (the defaults of `TrainConfig`), for precise SFT and the full-SFT baseline alike.

The global batch, exactly
    An optimizer step sees `batch_size` examples (`BatchPlan`: a function of seed and step). With P processes
    each takes a contiguous batch_size / P of them and cuts its share into micro-batches of `micro_batch_size`
    (gradient accumulation: batch_size / (P * micro_batch_size) forward/backward passes per step). The loss of a
    step is the mean token loss over the whole global batch,

        L = sum over every target token t of the global batch of -log p(t) / N_global,

    so every micro-batch backpropagates (sum of its token losses) * P / N_global, and DDP's average over the P
    processes gives exactly dL/dw: the same gradient for any P and micro-batch size (up to float rounding).
    Gradients are clipped to `max_grad_norm` (HF Trainer default 1.0) before the step.

Processes and devices
    `accelerator_for(device)` makes the Accelerator: DDP over processes started by `accelerate launch` (gloo on
    CPU with `--cpu`, NCCL on GPUs), mixed precision as configured there. Precise SFT replicates its tiny deltas
    and optimizer state, which DDP suits. Full SFT of a 7B model needs its parameters, gradients and optimizer
    state sharded: FSDP2 (accelerate config `fsdp_version: 2`). Under FSDP2 a copy of the trained module is
    sharded and trained, while the caller's model stays whole (frozen; precise SFT's anchors read it); at the end
    the trained values are gathered (finetune/sharded.py) into the caller's model, so writing the delta and the
    merged model is the same as without FSDP. Checkpoints hold whole tensors too, so a run can resume on another
    number of processes. FSDP version 1 and DeepSpeed are refused with one sentence.

Checkpoints and resume (finetune/checkpoint.py)
    Every `checkpoint_every` steps; `resume` continues from the newest one to the same final weights as an
    uninterrupted run, since the data of step s, the schedule and the RNG states are restored. `stop_after` ends
    this invocation after that many steps (with a checkpoint), leaving the schedule as planned, for time-limited
    jobs.

Measured: samples/second over the optimizer steps of this invocation (checkpoint writing excluded), peak memory
(CUDA max_memory_allocated since the start of training, or on CPU the process's peak resident set size, which
includes loading the model).
"""

from __future__ import annotations

import copy
import logging
import math
import resource
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from arithmech.errors import ConfigError
from arithmech.finetune.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from arithmech.finetune.data import BatchPlan, TokenizedExample, collate, rank_micro_batches
from arithmech.finetune.methods import Trainable
from arithmech.finetune.optim import AnchoredAdamW, build_scheduler, with_group_lrs
from arithmech.finetune.settings import TrainConfig
from arithmech.finetune.sharded import whole

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    steps: int
    """Optimizer steps done in all (including before a resume)."""
    total_steps: int
    finished: bool
    log: list[dict[str, float | None]]
    """One row per optimizer step: step, epoch, lr, loss, grad_norm (None without clipping), tokens, seconds."""
    samples_per_second: float | None
    """None when this invocation ran no step (a resume of a finished run)."""
    train_seconds: float
    """Time in optimizer steps during this invocation."""
    peak_memory: dict[str, Any]
    world_size: int
    distributed_type: str
    resumed_from: int | None = None


DIVERGED = 2.0
"""A run whose last step's loss is more than this many times its first's diverged (a rate too high): training
lowers the loss of a pretrained model, and step-to-step noise does not double it."""


def diverged(log: list[dict[str, Any]]) -> bool:
    """Whether the training loss of `log` (rows of TrainResult.log) rose DIVERGED-fold from the first step."""
    losses = [row["loss"] for row in log if row.get("loss") is not None]
    return len(losses) > 1 and losses[-1] > DIVERGED * losses[0]


def accelerator_for(device: torch.device) -> Any:
    """The Accelerator for a model loaded on `device` (CPU-only when the model is on the CPU).

    accelerate keeps one device choice per process, so a process trains on one device type.
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    from arithmech.distributed import WAIT_TIMEOUT

    wait = InitProcessGroupKwargs(timeout=WAIT_TIMEOUT)  # others wait while the main process writes a merged model
    try:
        accelerator = Accelerator(cpu=device.type == "cpu", kwargs_handlers=[wait])
        found = str(accelerator.device)
    except ValueError as err:  # accelerate: "AcceleratorState has already been initialized and cannot be changed"
        accelerator, found = None, str(err).splitlines()[0]
    if accelerator is None or accelerator.device.type != device.type:
        raise ConfigError(
            f"this process already set up training for another device than {device.type} ({found}); "
            "train on one device type per process"
        )
    return accelerator


def peak_memory(device: torch.device) -> dict[str, Any]:
    """CUDA max_memory_allocated on a GPU, else the process's peak resident set size."""
    if device.type == "cuda":
        return {"kind": "cuda_max_memory_allocated", "bytes": int(torch.cuda.max_memory_allocated(device))}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"kind": "cpu_peak_rss", "bytes": int(rss if sys.platform == "darwin" else rss * 1024)}


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum over target tokens of -log p: logits [batch, pos, d_vocab] predict labels shifted by one."""
    shifted = logits[:, :-1].reshape(-1, logits.shape[-1]).float()  # [batch * (pos - 1), d_vocab]
    return F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")


def train(
    accelerator: Any,
    trainable: Trainable,
    data: list[TokenizedExample],
    pad_id: int,
    cfg: TrainConfig,
    out_dir: Path,
    fingerprint: dict[str, Any],
    quiet: bool = False,
) -> TrainResult:
    """Train `trainable` on `data` with `cfg`; checkpoints go to `out_dir/checkpoints`.

    Dropout (and any other sampling) draws from a torch RNG seeded with (seed, process) inside a fork of the
    caller's RNG state, which is restored afterwards.
    """
    world = accelerator.num_processes
    if cfg.batch_size % (world * cfg.micro_batch_size):
        raise ConfigError(
            f"batch_size {cfg.batch_size} does not split into {world} processes x micro_batch_size "
            f"{cfg.micro_batch_size}; make batch_size a multiple of their product"
        )
    kind = str(accelerator.distributed_type).split(".")[-1]
    if kind == "DEEPSPEED" or (kind == "FSDP" and not accelerator.is_fsdp2):
        engine = "DeepSpeed" if kind == "DEEPSPEED" else "FSDP version 1"
        raise ConfigError(
            f"finetune runs on DDP or FSDP version 2, not {engine}; "
            "set fsdp_version: 2 in the accelerate config, or use one without FSDP or DeepSpeed"
        )
    plan = BatchPlan(len(data), cfg.batch_size, cfg.epochs, cfg.seed, cfg.max_steps)
    groups, anchors = trainable.optimizer_groups(cfg.weight_decay)
    groups = with_group_lrs(groups, cfg.lr)
    module, sharded = trainable.module, kind == "FSDP"
    home = next(module.parameters()).device
    if sharded:  # shard a copy (fully_shard moves it to the device); the caller's model stays whole, on the CPU
        copies: dict[int, Any] = {}
        module = copy.deepcopy(module.to("cpu"), copies)
        anchors = {id(copies[id(p)]): anchors[id(p)] for g in groups for p in g["params"] if id(p) in anchors}
        groups = [{**g, "params": [copies[id(p)] for p in g["params"]]} for g in groups]
    optimizer = AnchoredAdamW(
        groups, anchors, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, weight_decay=0.0
    )
    scheduler = build_scheduler(optimizer, cfg.lr_schedule, plan.total_steps, cfg.warmup_ratio)
    # The scheduler stays outside `prepare`: accelerate would step it once per process per step.
    module, optimizer = accelerator.prepare(module, optimizer)
    device = accelerator.device
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(cfg.seed * 1009 + accelerator.process_index)
        if cuda:
            torch.cuda.manual_seed(cfg.seed * 1009 + accelerator.process_index)
        loop = _Loop(accelerator, trainable, module, optimizer, scheduler, plan, data, pad_id, cfg)
        if cfg.resume:
            path = latest_checkpoint(out_dir)
            if path is None:
                raise ConfigError(f"there is no checkpoint to resume in {out_dir}; run without --resume")
            rank = accelerator.process_index
            state = load_checkpoint(path, module, loop.named, optimizer, scheduler, rank, fingerprint)
            loop.start, loop.log = int(state["step"]), list(state["log"])
            logger.info("resuming from %s (step %d of %d)", path, loop.start, plan.total_steps)
        loop.run(out_dir, fingerprint, quiet)
    if sharded:
        _gather_into(trainable, loop.named)
        del module, optimizer, loop.module, loop.optimizer, loop.named
        accelerator.free_memory()  # drop accelerate's references to the sharded copy
        trainable.module.to(home)
    steps_done = int(loop.log[-1]["step"]) if loop.log else loop.start
    return TrainResult(
        steps=steps_done,
        total_steps=plan.total_steps,
        finished=steps_done >= plan.total_steps,
        log=loop.log,
        samples_per_second=loop.done * cfg.batch_size / loop.seconds if loop.seconds > 0 else None,
        train_seconds=loop.seconds,
        peak_memory=peak_memory(device),
        world_size=world,
        distributed_type=kind,
        resumed_from=loop.start if cfg.resume else None,
    )


def _gather_into(trainable: Trainable, trained: list[tuple[str, torch.nn.Parameter]]) -> None:
    """Copy the trained values, gathered whole from their shards, into the caller's model (collective)."""
    targets = dict(trainable.trainable_named())
    with torch.no_grad():
        for name, p in trained:
            targets[name].copy_(whole(p).to(targets[name].device))


class _Loop:
    """The optimizer steps of one invocation, from `start` (0, or a checkpoint's step) on."""

    def __init__(
        self,
        accelerator: Any,
        trainable: Trainable,
        module: Any,
        optimizer: Any,
        scheduler: Any,
        plan: BatchPlan,
        data: list[TokenizedExample],
        pad_id: int,
        cfg: TrainConfig,
    ) -> None:
        self.accelerator, self.trainable, self.module = accelerator, trainable, module
        self.optimizer, self.scheduler, self.plan = optimizer, scheduler, plan
        self.data, self.pad_id, self.cfg = data, pad_id, cfg
        self.named = [(n, p) for n, p in accelerator.unwrap_model(module).named_parameters() if p.requires_grad]
        self.start, self.log = 0, []
        self.done, self.seconds = 0, 0.0

    def step(self, step: int) -> dict[str, float | None]:
        """One optimizer step on the global batch of `step`; returns its log row."""
        acc, cfg, device = self.accelerator, self.cfg, self.accelerator.device
        world = acc.num_processes
        indices = self.plan.step_indices(step)
        n_tokens = sum(self.data[i].n_target for i in indices)
        micros = rank_micro_batches(indices, acc.process_index, world, cfg.micro_batch_size)
        loss_sum = torch.zeros((), device=device)
        for j, micro in enumerate(micros):
            batch = collate([self.data[i] for i in micro], self.pad_id, device)
            with nullcontext() if j == len(micros) - 1 else acc.no_sync(self.module):  # sync on the last one
                out = self.module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
                micro_loss = token_loss_sum(out.logits, batch["labels"])
                acc.backward(micro_loss * (world / n_tokens))
            loss_sum += micro_loss.detach()
        grad_norm = None
        if cfg.max_grad_norm > 0:
            grad_norm = float(acc.clip_grad_norm_([p for _, p in self.named], cfg.max_grad_norm))
        lr = float(self.scheduler.get_last_lr()[0]) / self.optimizer.param_groups[0].get("lr_scale", 1.0)  # base lr
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = float(acc.reduce(loss_sum, "sum")) / n_tokens
        if not math.isfinite(loss):  # the same on every process (a reduced sum), so all stop together
            raise ConfigError(
                f"training diverged at step {step + 1} of {self.plan.total_steps}: the loss is {loss}; lower the "
                f"learning rate (now {cfg.lr:g}) or clip gradients (max_grad_norm), and start afresh"
            )
        epoch = round(self.plan.epoch_of(step + 1), 4)
        return {"step": step + 1, "epoch": epoch, "lr": lr, "loss": loss, "grad_norm": grad_norm, "tokens": n_tokens}

    def run(self, out_dir: Path, fingerprint: dict[str, Any], quiet: bool) -> None:
        from tqdm.auto import tqdm

        acc, cfg, total = self.accelerator, self.cfg, self.plan.total_steps
        if acc.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(acc.device)
        self.module.train()
        bar = tqdm(total=total, initial=self.start, desc=f"finetune {self.trainable.method}", unit="step",
                   disable=quiet or not acc.is_main_process)  # fmt: skip
        for step in range(self.start, total):
            began = time.perf_counter()
            row = self.step(step)
            row["seconds"] = time.perf_counter() - began
            self.seconds += row["seconds"]
            self.done += 1
            self.log.append(row)
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.4f}")
            last = step + 1 == total
            stopping = cfg.stop_after is not None and self.done >= cfg.stop_after and not last
            due = bool(cfg.checkpoint_every) and (step + 1) % cfg.checkpoint_every == 0 and not last
            if stopping or due:
                state = {"log": self.log, "fingerprint": fingerprint, "total_steps": total}
                save_checkpoint(acc, out_dir, step + 1, self.module, self.named, self.optimizer, self.scheduler, state)
            if stopping:
                logger.info("stopped after %d steps as asked (stop_after); continue with --resume", self.done)
                break
        bar.close()
        self.module.eval()
        acc.wait_for_everyone()
