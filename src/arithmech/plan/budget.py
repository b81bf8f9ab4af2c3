"""A stage's batch and chunk sizes under a memory budget (--max-memory), chosen before the model loads.

Background
    The plan (planner.plan_stage) says what a stage's peak is for its sizes, from the model's shape alone. So a
    stage can choose its sizes before it loads anything: read the shape (shape_sources: config.json or a GGUF
    header), and where the planned peak is over the budget, lower the sizes the plan's memory reads (KNOBS), one
    after another, each to the largest value not above the configured one that fits (a bisection: the peak grows
    with each). The work is the same, cut into more passes, so the numbers are the same; a test holds every
    stage to that (tests/integration/test_memory_budget.py: to 1e-6 in float32).

    Budget B: --max-memory, else what the device has free (free_memory.py). With the model already loaded (the
    Python API, `run` given a model) its weights count as free too, since the planned peak counts them.
    Layout: one process holds the whole model (each process of a DDP launch too), and the peak is the plan's
    `single`; --device auto over G GPUs is its `auto` (a G-th of the weights, every activation, per GPU), and
    finetune under an FSDP2 launch of P processes its `fsdp2`. A run that trains or scores a copy of the model
    beside it (`arithmech run`'s finetune and tuned evaluate), and evaluate loading a base model for the general
    check's KL (`base_model`, planned as large as the model), hold those weights on top.

Refusal (one ConfigError sentence, before the model loads, nothing written)
    B below the weights alone; or the peak at the smallest sizes still over B, which names that peak (a device
    with it free runs the stage) and the other ways out: --device auto, FSDP2 (finetune), or the most prompts that
    fit, where fewer prompts plan less.

Usage
    >>> budget = before_load(ModelConfig(model="Qwen/Qwen2.5-7B", device="cuda", max_memory="24GB"))
    >>> fit = budget.fit(IdentifyConfig(batch_size=64))    # batch_size 64 -> 24, logged
    >>> result = identify(load_model(...), fit.cfg, out)
    >>> fit.record(out)                                     # metadata.json's memory_budget
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arithmech import distributed, preflight
from arithmech.errors import ConfigError
from arithmech.plan import prompt_widths
from arithmech.plan.devices import PROFILES
from arithmech.plan.free_memory import free_memory, gpu_count
from arithmech.plan.planner import PlanOptions, StagePlan, plan_stage
from arithmech.plan.shape import DTYPE_BYTES, ModelShape, plan_dtype
from arithmech.plan.shape_sources import read_shape, shape_from_config
from arithmech.plan.sizes import format_size, parse_size
from arithmech.runs import atomic_write_json

logger = logging.getLogger(__name__)

KNOBS: dict[str, tuple[str, ...]] = {
    **{stage: ("batch_size",) for stage in ("identify", "knockout", "transfer", "attention", "mlp", "fourier",
                                           "agreement", "neurons", "heuristics", "circuit", "evaluate")},
    "numbers": ("batch_size", "max_rows"),
    "mediation": ("max_rows",),
    "finetune": ("micro_batch_size",),
}  # fmt: skip
"""The config fields whose values the plan's memory of a stage reads and the stage may lower, in that order
(finetune's batch_size is the optimizer's, so only its micro-batches shrink)."""
PROMPT_FIELDS = ("max_prompts", "n_prompts", "n_pairs", "max_pairs", "limit")
"""The field that counts a stage's prompts (the first its config has), named when fewer prompts would fit."""
FSDP2_LAUNCH = "accelerate launch --config_file configs/accelerate-fsdp2.yaml"


@dataclass(frozen=True)
class BudgetFit:
    """A stage's config with its sizes chosen, and what metadata.json records of how (`details`)."""

    cfg: Any
    details: dict[str, Any]

    def record(self, out_dir: str | os.PathLike[str]) -> None:
        """Add `memory_budget` to the stage's finished metadata.json (rank 0 writes it; nothing without one): a
        second atomic write, so the folder reads complete before it and after it."""
        path = Path(out_dir) / "metadata.json"
        if not distributed.is_main() or not path.is_file():
            return
        metadata = json.loads(path.read_text(encoding="utf-8"))
        atomic_write_json(path, {**metadata, "memory_budget": self.details})


def unfitted(cfg: Any, why: str) -> BudgetFit:
    """The sizes as given, when no budget can be planned (`why`)."""
    return BudgetFit(cfg, {"max_memory": None, "why": why})


@dataclass(frozen=True)
class MemoryBudget:
    """What a stage's sizes are fitted to: the model's shape and dtype, the bytes it may plan and their source, and
    over how many devices the model is spread (GPUs of --device auto; processes of an FSDP2 launch)."""

    shape: ModelShape
    dtype: str
    bytes: int
    source: str
    """The option that gave it (--max-memory, or the API's max_memory), or where the free memory was read."""
    given: bool = True
    gpus: int = 1
    fsdp_processes: int = 1
    launched: int = 1
    cpu: bool = False
    """The device is this machine's CPU: results the engines keep in host memory count against the budget too."""
    reader: prompt_widths.WidthReader | None = None
    """Reads a stage's widest prompt with the model's tokenizer; None: every stage plans at the plan's assumed
    width."""
    identify: prompt_widths.IdentifySource | None = None
    """The identify run a stage reads where its config does not name it (`reading`)."""

    @property
    def label(self) -> str:
        if self.given:
            return f"{self.source} {format_size(self.bytes)}"
        return f"{self.source} ({format_size(self.bytes)})"

    def reading(self, identify: prompt_widths.IdentifySource | None) -> MemoryBudget:
        """This budget for a stage that reads the identify run `identify` (a folder, or the settings that will make
        it: prompt_widths.py), where its config does not name it; the read widths are shared."""
        return self if identify is None else dataclasses.replace(self, identify=identify)

    def layout(self, stage: str) -> tuple[str, int]:
        """(the plan's process layout, the devices the weights are split over) of `stage`."""
        if stage == "finetune" and self.fsdp_processes > 1:
            return "fsdp2", self.fsdp_processes
        return ("auto", self.gpus) if self.gpus > 1 else ("single", 1)

    def weights(self, share: int = 1) -> int:
        return self.shape.n_params * DTYPE_BYTES[self.dtype] // share

    def plan(self, cfg: Any) -> StagePlan:
        """The plan of `cfg`'s stage in its layout, at its widest prompt where that is data (the time estimate is
        not used)."""
        stage = stage_name(cfg)
        device = dataclasses.replace(PROFILES["h100"], kind="cpu") if self.cpu else PROFILES["h100"]  # time unused
        options = PlanOptions(self.dtype, device, self.layout(stage)[1], self.prompt_tokens(cfg))
        return plan_stage(self.shape, stage, cfg, options)

    def prompt_tokens(self, cfg: Any) -> int | None:
        """The widest prompt of `cfg`'s stage, read with the tokenizer (prompt_widths.py); None (the plan's assumed
        width) without a reader, where it cannot read (logged), or under a budget below the weights, which is
        refused without reading anything."""
        stage = stage_name(cfg)
        if self.reader is None or self.bytes < self.weights(self.layout(stage)[1]):
            return None
        return self.reader.widest(stage, cfg, self.identify, KNOBS[stage])

    def peak(self, cfg: Any, copies: int = 0) -> int:
        """The planned peak of `cfg`'s stage in its layout, with `copies` of the model held beside it."""
        layout, share = self.layout(stage_name(cfg))
        return self.plan(cfg).memory[layout].peak + copies * self.weights(share)

    def fits(self, cfg: Any, copies: int, name: str, value: int) -> bool:
        """Whether `cfg` with the setting `name` at `value` plans within the budget."""
        return self.peak(dataclasses.replace(cfg, **{name: value}), copies) <= self.bytes

    def fit(self, cfg: Any, copies: int = 0, option_prefix: str | None = None) -> BudgetFit:
        """`cfg` with its KNOBS lowered until the planned peak fits (module docstring); `copies` of the model held
        beside it; `option_prefix` names settings as a run config does ("identify.max_prompts") instead of as
        options (--max-prompts)."""
        stage = stage_name(cfg)
        layout, share = self.layout(stage)
        copies = max(copies, int(stage == "evaluate" and cfg.base_model is not None))  # its own base model for KL
        ways = ["a larger budget" if self.given else "a device with more free memory"]
        ways += ["a 16-bit --dtype"] if self.dtype == "float32" else []
        ways += [] if share > 1 else ["--device auto (the layers over GPUs)"]
        refuse_below_weights(self.bytes, self.label, self.shape, self.dtype, share, either(ways))
        asked = {knob: getattr(cfg, knob) for knob in KNOBS[stage]}
        for knob in KNOBS[stage]:
            if self.peak(cfg, copies) <= self.bytes:
                break
            values = self._values(stage, cfg, knob)
            best = _largest(values, functools.partial(self.fits, cfg, copies, knob))
            cfg = dataclasses.replace(cfg, **{knob: values[0] if best is None else best})
        need = self.peak(cfg, copies)
        if need > self.bytes:
            raise ConfigError(self._refusal(stage, cfg, need, copies, option_prefix))
        lowered = {k: {"from": v, "to": getattr(cfg, k)} for k, v in asked.items() if getattr(cfg, k) != v}
        if lowered:
            changes = ", ".join(f"{k} {v['from']} -> {v['to']}" for k, v in lowered.items())
            logger.info("%s: %s, so that its planned peak (%s) stays under %s", stage, changes, format_size(need),
                        self.label)  # fmt: skip
        return BudgetFit(cfg, {
            "max_memory": self.bytes, "from": self.source, "layout": layout, "planned_peak": need,
            "prompt_tokens": self.plan(cfg).tokens,
            "model_copies": copies, "sizes": {k: getattr(cfg, k) for k in asked}, "lowered": lowered,
        })  # fmt: skip

    def _values(self, stage: str, cfg: Any, knob: str) -> list[int]:
        """The values `knob` may take, ascending, none above the configured one: finetune's micro-batches must
        divide each process's share of a batch."""
        top = int(getattr(cfg, knob))
        if stage != "finetune":
            return list(range(1, top + 1))
        share = max(1, cfg.batch_size // self.launched)
        return [v for v in range(1, top + 1) if share % v == 0] or [1]

    def _refusal(self, stage: str, cfg: Any, need: int, copies: int, prefix: str | None) -> str:
        """The sentence of a stage that does not fit at its smallest sizes: what it needs, and the ways out."""
        share = self.layout(stage)[1]
        sizes = ", ".join(f"{k} {getattr(cfg, k)}" for k in KNOBS[stage])
        weights = (1 + copies) * self.weights(share)
        ways = [f"a device with {format_size(need)} free"]
        if share == 1:
            ways.append(f"--device auto (each GPU holds a share of the {format_size(weights)} of weights)")
        if stage == "finetune" and self.fsdp_processes == 1:
            ways.append(f"FSDP2, which shards weights, gradients and optimizer state ({FSDP2_LAUNCH})")
        prompts = self._fewer_prompts(cfg, copies)
        if prompts is not None:
            name, most = prompts
            option = f"{prefix}.{name}" if prefix else "--" + name.replace("_", "-")
            ways.append(f"at most {most} prompts ({option} {most})")
        return (
            f"{stage} plans {format_size(need)} even at {sizes} ({format_size(weights)} of it weights), over "
            f"{self.label}; give it {either(ways)}"
        )

    def _fewer_prompts(self, cfg: Any, copies: int) -> tuple[str, int] | None:
        """(the prompt-count field, the most prompts that fit) where fewer prompts plan less and some fit."""
        name = next((f for f in PROMPT_FIELDS if getattr(cfg, f, None)), None)
        if name is None:
            return None
        asked = int(getattr(cfg, name))
        low = next((v for v in range(1, asked) if _valid(cfg, name, v)), asked)  # e.g. agreement needs 2
        most = _largest(list(range(low, asked)), functools.partial(self.fits, cfg, copies, name))
        return None if most is None else (name, most)


def stage_name(cfg: Any) -> str:
    """The name the plan and `arithmech run` give the stage of a config ("analyze-mlp" -> "mlp")."""
    return preflight.SUBFOLDERS.get(cfg.STAGE, cfg.STAGE)


def either(ways: list[str]) -> str:
    """'a, b, or c'."""
    return ", ".join(ways[:-1]) + ", or " + ways[-1] if len(ways) > 1 else ways[0]


def _valid(cfg: Any, name: str, value: int) -> bool:
    try:
        dataclasses.replace(cfg, **{name: value})
    except ConfigError:
        return False
    return True


def _largest(values: list[int], fits: Callable[[int], bool]) -> int | None:
    """The largest of ascending `values` that fits, by bisection (what fits is a prefix); None if none does."""
    lo, hi, best = 0, len(values) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(values[mid]):
            best, lo = values[mid], mid + 1
        else:
            hi = mid - 1
    return best


def refuse_below_weights(budget: int, label: str, shape: ModelShape, dtype: str, share: int, ways: str) -> None:
    """One sentence when `budget` cannot hold even the weights (a `share` of them per device), naming `ways` out."""
    weights = shape.n_params * DTYPE_BYTES[dtype] / share
    if budget < weights:
        each = " per process" if share > 1 else ""
        raise ConfigError(f"{label} is below the weights alone ({format_size(weights)} of {shape.name} in "
                          f"{dtype}{each}); give {ways}")  # fmt: skip


def before_load(model: Any, option: str = "--max-memory") -> MemoryBudget | str:
    """The budget of stages about to load `model` (a `ModelConfig`): its shape read without weights, its
    max_memory or its device's free memory; or why there is none (a default budget is skipped, with that reason,
    where the shape or the free memory cannot be read; a given one is then one sentence)."""
    given = parse_size(model.max_memory, option) if model.max_memory is not None else None
    try:
        shape = read_shape(model.model, model.gguf_file, model.revision, download=True)
    except ConfigError as err:
        if given is not None:
            raise ConfigError(f"{option} needs the model's shape before it loads, and {err}") from None
        return f"the model's shape cannot be read before it loads ({err})"
    budget = _budget(shape, plan_dtype(model.dtype, shape.dtype), model.device, given, False, option)
    return budget if isinstance(budget, str) else dataclasses.replace(budget, reader=tokenizer_reader(model, shape))


def tokenizer_reader(model: Any, shape: ModelShape) -> prompt_widths.WidthReader:
    """Reads widths with `model`'s (a `ModelConfig`) tokenizer, loaded once for all the stages of a run."""
    return prompt_widths.WidthReader(functools.cache(functools.partial(_tokenizer_of, model)), shape.context)


def _tokenizer_of(model: Any) -> Any:
    from arithmech.models.load import load_tokenizer

    return load_tokenizer(model)


def of_loaded(handle: Any, max_memory: str | int | None, option: str = "max_memory") -> MemoryBudget | str:
    """The budget of a stage run on a model already loaded (`handle`): its weights count as free."""
    given = parse_size(str(max_memory), option) if max_memory is not None else None
    config = handle.model.config.to_dict()
    shape = shape_from_config(config, str(handle.source.get("model")), "the loaded model's config")
    dtype = plan_dtype(str(handle.source.get("dtype", "float32")), None)
    budget = _budget(shape, dtype, str(handle.source.get("device", "cpu")), given, True, option)
    reader = prompt_widths.WidthReader(lambda: handle.tokenizer, shape.context)
    return budget if isinstance(budget, str) else dataclasses.replace(budget, reader=reader)


def _budget(shape: ModelShape, dtype: str, device: str, given: int | None, loaded: bool,
            option: str) -> MemoryBudget | str:  # fmt: skip
    """`given` bytes, else the device's free memory (with a `loaded` model's weights, in use already, counted)."""
    launched = distributed.launched_processes()
    fsdp = launched if launched > 1 and os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" else 1
    gpus = max(1, gpu_count()) if device == "auto" and launched == 1 else 1
    cpu = device == "cpu" or (device == "auto" and gpu_count() == 0)  # auto falls back to the CPU
    if given is not None:
        return MemoryBudget(shape, dtype, given, option, True, gpus, fsdp, launched, cpu)
    free = free_memory(device)
    if free is None:
        return f"this machine does not say how much memory {device} has free"
    held = shape.n_params * DTYPE_BYTES[dtype] // gpus if loaded else 0
    return MemoryBudget(shape, dtype, free[0] + held, free[1], False, gpus, fsdp, launched, cpu)


def fit_or_keep(budget: MemoryBudget | str, cfg: Any, copies: int = 0, option_prefix: str | None = None,
                identify: prompt_widths.IdentifySource | None = None) -> BudgetFit:  # fmt: skip
    """`budget.fit(cfg)`, or `cfg` as it is when there is no budget or the plan cannot model the settings (the
    stage may still run them: the budget never stops what the plan does not know); the reason is logged, as a
    warning when the budget was given. `identify`: the identify run the stage reads, where its config does not
    name it (`MemoryBudget.reading`)."""
    given = isinstance(budget, MemoryBudget) and budget.given
    if isinstance(budget, MemoryBudget):
        budget = budget.reading(identify)
        try:
            budget.peak(cfg, copies)
        except ConfigError as err:
            budget = f"the plan cannot model these settings ({err})"
    if isinstance(budget, str):
        logger.log(logging.WARNING if given else logging.INFO, "%s: sizes as configured: %s", cfg.STAGE, budget)
        return unfitted(cfg, budget)
    return budget.fit(cfg, copies, option_prefix)
