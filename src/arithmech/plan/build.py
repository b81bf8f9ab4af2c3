"""Build a `Plan` from the command's options: the shape, the stages' configs, the device, the budget.

The stages' configs come built (cli/plan.py builds them as `arithmech run` does, so a plan takes the same settings
as the stage); this module reads the shape, checks the dtype and the budget, and plans each stage: at its widest
prompt read with the model's tokenizer where one is on this machine, as the stage's memory budget will
(plan/prompt_widths.py), else at the plan's assumed width (planner.PROMPT_TOKENS, or --prompt-tokens).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from arithmech.plan.budget import either, refuse_below_weights, stage_name, tokenizer_reader
from arithmech.plan.devices import device_profile
from arithmech.plan.planner import PlanOptions, plan_stage
from arithmech.plan.prompt_widths import READS_IDENTIFY, WidthReader
from arithmech.plan.record import Plan
from arithmech.plan.shape import ModelShape, plan_dtype
from arithmech.plan.shape_sources import read_shape
from arithmech.plan.sizes import format_size, parse_size
from arithmech.stages.identify_config import IdentifyConfig


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
    reader = None if prompt_tokens is not None else local_reader(model, gguf_file, revision, shape)
    if reader is None:
        stages = [plan_stage(shape, name, cfg, options) for name, cfg in settings.items()]
        given = "given" if prompt_tokens is not None else "assumed"
        return Plan(shape, dtype, options.device, processes, stages, budget, given)
    identify = settings.get("identify") or IdentifyConfig()  # what `run` makes first, and the analyses read
    widths = {name: reader.widest(stage_name(cfg), cfg, identify if stage_name(cfg) in READS_IDENTIFY else None)
              for name, cfg in settings.items()}  # fmt: skip
    stages = [plan_stage(shape, name, cfg, dataclasses.replace(options, prompt_tokens=widths[name]))
              for name, cfg in settings.items()]  # fmt: skip
    return Plan(shape, dtype, options.device, processes, stages, budget, "read")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files of a local folder that hold a tokenizer."""


def local_reader(model: str | None, gguf_file: str | None, revision: str | None,
                 shape: ModelShape) -> WidthReader | None:  # fmt: skip
    """A reader of the stages' widest prompts with the model's tokenizer, where one is on this machine without
    its weights (the built-in model, a GGUF file, a folder holding one; presets and config.json files have none,
    and a hub id is not fetched: the plan downloads nothing); None: the plan's assumed widths."""
    from arithmech.models.model_config import ModelConfig

    if model is not None:
        path = Path(model).expanduser()
        if path.suffix == ".gguf" and path.is_file():
            model, gguf_file = str(path.parent), path.name
        elif not path.is_dir() or (gguf_file is None and not any((path / f).is_file() for f in TOKENIZER_FILES)):
            return None
    return tokenizer_reader(ModelConfig(model=model, gguf_file=gguf_file, revision=revision), shape)
