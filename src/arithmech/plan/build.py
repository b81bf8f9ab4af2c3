"""Build a `Plan` from the command's options: the shape, the stages' configs, the device, the budget.

Stage settings are built as `arithmech run` builds them (pipeline.build_stage_config: each value checked against
its field's type, the folders a stage reads filled with a placeholder), so a plan takes the same settings as the
stage; a `run` config (--config) gives its model, stages and settings through pipeline.load_run_config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arithmech.errors import ConfigError
from arithmech.plan.devices import device_profile
from arithmech.plan.planner import PlanOptions, plan_stage
from arithmech.plan.record import Plan
from arithmech.plan.shape import DTYPE_BYTES
from arithmech.plan.shape_sources import read_shape
from arithmech.plan.sizes import format_size, parse_size


def make_plan(
    stage: str | None = None,
    stage_values: dict[str, Any] | None = None,
    model: str | None = None,
    gguf_file: str | None = None,
    revision: str | None = None,
    dtype: str | None = None,
    device_profile: str = "h100",
    processes: int = 1,
    prompt_tokens: int | None = None,
    max_memory: str | None = None,
    config: Path | None = None,
) -> Plan:
    """The plan; every bad input is one ConfigError sentence, raised before anything is written."""
    from arithmech import pipeline

    budget = parse_size(max_memory) if max_memory is not None else None
    if config is not None:
        run = pipeline.load_run_config(config, {} if stage is None else {"stages": stage})
        settings = run.settings
        model = model or run.model.get("model")
        gguf_file = gguf_file or run.model.get("gguf_file")
        dtype = dtype or run.model.get("dtype")
    else:
        names = [stage] if stage is not None else [s.name for s in pipeline.STAGES]
        chosen = [pipeline.stage_by_name(name) for name in names]
        settings = {s.name: pipeline.build_stage_config(s, dict(stage_values or {}), 0) for s in chosen}
    shape = read_shape(model, gguf_file, revision)
    dtype = dtype or "float32"
    if dtype == "auto":
        dtype = shape.dtype if shape.dtype in DTYPE_BYTES else "float32"
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join([*DTYPE_BYTES, 'auto'])}")
    weights = shape.n_params * DTYPE_BYTES[dtype]
    if budget is not None and budget < weights / processes:
        spread = "" if processes > 1 else ", or spread it over GPUs (--processes N: --device auto or FSDP2)"
        raise ConfigError(
            f"--max-memory {format_size(budget)} is below the weights alone ({format_size(weights / processes)} of "
            f"{shape.name} in {dtype}{' per process' if processes > 1 else ''}); give a larger budget, a 16-bit "
            f"--dtype{spread}"
        )
    options = PlanOptions(dtype, device_profile_of(device_profile), processes, prompt_tokens)
    stages = [plan_stage(shape, name, cfg, options) for name, cfg in settings.items()]
    return Plan(shape, dtype, options.device, processes, stages, budget)


def device_profile_of(name: str) -> Any:
    return device_profile(name)
