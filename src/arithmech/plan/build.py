"""Build a `Plan` from the command's options: the shape, the stages' configs, the device, the budget.

The stages' configs come built (cli/plan.py builds them as `arithmech run` does, so a plan takes the same settings
as the stage); this module reads the shape, checks the dtype and the budget, and plans each stage.
"""

from __future__ import annotations

from typing import Any

from arithmech.plan.budget import either, refuse_below_weights
from arithmech.plan.devices import device_profile
from arithmech.plan.planner import PlanOptions, plan_stage
from arithmech.plan.record import Plan
from arithmech.plan.shape import plan_dtype
from arithmech.plan.shape_sources import read_shape
from arithmech.plan.sizes import format_size, parse_size


def make_plan(
    settings: dict[str, Any],
    model: str | None = None,
    gguf_file: str | None = None,
    revision: str | None = None,
    dtype: str | None = None,
    device_profile_name: str = "h100",
    processes: int = 1,
    prompt_tokens: int | None = None,
    max_memory: str | None = None,
) -> Plan:
    """The plan of the stages in `settings` (stage name -> its config object); every bad input is one ConfigError
    sentence, raised before anything is written."""
    budget = parse_size(max_memory) if max_memory is not None else None
    shape = read_shape(model, gguf_file, revision)
    dtype = plan_dtype(dtype or "float32", shape.dtype)
    if budget is not None:
        spread = [] if processes > 1 else ["spread it over GPUs (--processes N: --device auto or FSDP2)"]
        refuse_below_weights(budget, f"--max-memory {format_size(budget)}", shape, dtype, processes,
                             either(["a larger budget", "a 16-bit --dtype", *spread]))  # fmt: skip
    options = PlanOptions(dtype, device_profile(device_profile_name), processes, prompt_tokens)
    stages = [plan_stage(shape, name, cfg, options) for name, cfg in settings.items()]
    return Plan(shape, dtype, options.device, processes, stages, budget)
