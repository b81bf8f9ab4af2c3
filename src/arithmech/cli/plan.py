"""`arithmech plan`: planned memory and estimated time of stages, from the model's shape only (no weights load).

Examples:
    arithmech plan --model llama3.1-8b                                  # every stage, default settings, H100
    arithmech plan identify --model mistral-7b --max-prompts 1000 --batch-size 16 --device-profile a100-40
    arithmech plan finetune --model qwen2.5-7b --method full --dtype bfloat16 --processes 8
    arithmech plan --config configs/default-model.yaml --device-profile measured
    arithmech plan circuit --model ./my-model/config.json --n-prompts 32 --max-memory 24GB

A stage's options are its command's (`arithmech <stage> --help`), given after the stage's name; a run config's
stages and settings with --config. Memory is planned and time estimated, never measured.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.cli.app import app
from arithmech.cli.options import QuietOpt, setup_logging
from arithmech.errors import ConfigError


def _stage_values(args: list[str]) -> dict[str, Any]:
    """--max-prompts 1000 --evaluate --no-chat-template -> {max_prompts: 1000, evaluate: True, chat_template:
    False}; values are read as YAML scalars and checked against the stage's fields by the pipeline's rules."""
    import yaml

    values: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; stage options are --name value, e.g. --max-prompts 1000")
        name, sep, value = arg[2:].partition("=")
        if not sep and (i + 1 == len(args) or args[i + 1].startswith("--")):
            key = name.removeprefix("no-").replace("-", "_")
            values[key] = not name.startswith("no-")
        else:
            if not sep:
                i += 1
                value = args[i]
            parsed = yaml.safe_load(value)
            values[name.replace("-", "_")] = value.split(",") if isinstance(parsed, str) and "," in value else parsed
        i += 1
    aliases = {"from": "from_run", "heads": "components", "keep_incorrect": "filter_correct"}
    return {aliases.get(k, k): (not v if k == "keep_incorrect" else v) for k, v in values.items()}


def _settings(stage: str | None, values: dict[str, Any], config: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(stage name -> its config object, built as `arithmech run` builds it: each value checked against its
    field's type, the folders a stage reads filled with a placeholder; the run config's `model:` settings, or
    none without --config)."""
    from arithmech import pipeline

    if config is not None:
        run = pipeline.load_run_config(config, {} if stage is None else {"stages": stage})
        return run.settings, run.model
    names = [stage] if stage is not None else [s.name for s in pipeline.STAGES]
    chosen = [pipeline.stage_by_name(name) for name in names]
    return {s.name: pipeline.build_stage_config(s, dict(values), 0) for s in chosen}, {}


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def plan(
    ctx: typer.Context,
    stage: Annotated[
        str | None, typer.Argument(help="The stage to plan (default every stage); its options follow.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="A preset (llama2-7b, llama3.1-8b, mistral-7b, qwen2.5-7b, gemma2-9b, smollm2-135m), a "
            "hub id whose config.json is in the local cache, a folder, a config.json or a .gguf file; "
            "default the built-in model."
        ),
    ] = None,
    gguf_file: Annotated[str | None, typer.Option(help="GGUF file name inside the --model folder.")] = None,
    revision: Annotated[str | None, typer.Option(help="Hub revision of the cached config.json.")] = None,
    dtype: Annotated[str, typer.Option(help="float32, float16, bfloat16 or auto (the checkpoint's own).")] = "",
    device_profile: Annotated[
        str,
        typer.Option(
            help="Device the time is estimated for: h100, h200, a100-80, a100-40, rtx4090, or "
            "measured (a short probe of this machine)."
        ),
    ] = "h100",
    processes: Annotated[
        int, typer.Option(min=1, help="Processes (GPUs) of a launch: adds DDP, FSDP2 and --device auto layouts.")
    ] = 1,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(min=1, help="Tokens of a prompt (default: each stage's widest, read with the model's tokenizer "
                                 "where one is on this machine, else 48, circuit 16, evaluate 256)."),
    ] = None,
    max_memory: Annotated[
        str | None, typer.Option(help="Memory budget per device, e.g. 24GB or 80GiB; stages over it are marked.")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="A `run` config (YAML): its model, stages and settings.")] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for plan.json; default runs/plan-<time>.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Plan a stage's peak memory (weights, cached activations, gradients, optimizer state, largest temporary)
    per process, its work in forward passes, batch and chunk sizes, and an estimated time on a device.

    Reads the model's shape, and its tokenizer where one is on this machine (the stages' widest prompts): no weights
    load and nothing is downloaded. Memory is planned and time estimated
    (roofline at 50 % of peak FLOP/s, 80 % of bandwidth), never measured.
    """
    setup_logging(quiet)
    from arithmech.plan.build import make_plan

    values = _stage_values(list(ctx.args))
    if values and stage is None:
        raise ConfigError(
            "stage options need a stage name before them, e.g. arithmech plan identify --max-prompts 1000"
        )
    settings, loaded = _settings(stage, values, config)
    result = make_plan(
        settings, model=model or loaded.get("model"), gguf_file=gguf_file or loaded.get("gguf_file"),
        revision=revision, dtype=dtype or loaded.get("dtype"), device_profile_name=device_profile,
        processes=processes, prompt_tokens=prompt_tokens, max_memory=max_memory or loaded.get("max_memory"),
    )  # fmt: skip
    folder = out or Path("runs") / time.strftime("plan-%Y%m%d-%H%M%S")
    from arithmech.runs import atomic_write_json

    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / "plan.json", result.as_dict())
    for line in result.table():
        typer.echo(line)
    typer.echo(f"plan in {folder / 'plan.json'}")
