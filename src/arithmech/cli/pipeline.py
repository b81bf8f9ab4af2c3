"""`arithmech run`: every stage into one run folder, from a YAML config and/or flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.cli.app import app
from arithmech.cli.options import QuietOpt, model_options, setup_logging
from arithmech.errors import ConfigError

_MODEL_DEFAULTS = {"model": None, "gguf_file": None, "device": "cpu", "dtype": "float32", "revision": None,
                   "max_memory": None}  # fmt: skip


def _assignments(pairs: list[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set takes KEY=VALUE, e.g. identify.max_prompts=32 (got {pair!r})")
        out[key.strip()] = yaml.safe_load(value)
    return out


@app.command("run")
@model_options
def run(
    config: Annotated[Path | None, typer.Option(help="YAML run description (see configs/).")] = None,
    stages: Annotated[str | None, typer.Option(help="Comma list of stages to run, e.g. identify,knockout.")] = None,
    out: Annotated[Path | None, typer.Option(help="Run folder (overrides the config's out).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed given to every stage (overrides the config's).")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Override one setting, e.g. --set knockout.max_k=8; repeat."),
    ] = None,
    quiet: QuietOpt = False,
    load: Any = None,
) -> None:
    """Run the stages into one run folder, in this order: identify, knockout, transfer, attention, mlp, fourier,
    mediation, agreement, neurons, heuristics, numbers, circuit, finetune, evaluate. fourier, heuristics,
    numbers, circuit and finetune run only when named (--stages or the config's stages); the others run unless
    --stages leaves them out.

    A stage whose settings and inputs are unchanged since the last run into the same folder is not recomputed,
    so rerunning after an interruption resumes where it stopped.
    """
    setup_logging(quiet)
    from arithmech.pipeline import load_run_config, run_pipeline

    overrides = _assignments(set_ or [])
    model = {k: v for k, v in load.keywords.items() if k in _MODEL_DEFAULTS}  # not threads, quiet: no results
    overrides.update({f"model.{k}": v for k, v in model.items() if v != _MODEL_DEFAULTS[k]})
    if stages is not None:
        overrides["stages"] = stages
    if out is not None:
        overrides["out"] = str(out)
    if seed is not None:
        overrides["seed"] = seed
    cfg = load_run_config(config, overrides)
    from arithmech.models.load import set_threads

    set_threads(load.keywords["threads"])
    results = run_pipeline(cfg, quiet=quiet)
    for name, result in results.items():
        state = "kept (unchanged)" if isinstance(result, Path) else "done"
        typer.echo(f"{name:10s} {state}: {Path(cfg.out) / name}")
    typer.echo(f"results in {cfg.out}")
