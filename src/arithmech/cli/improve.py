"""`arithmech finetune` and `arithmech evaluate`: train the key heads, and measure math and general ability.

Their options are generated from FinetuneConfig and EvaluateConfig (cli/config_options.py). Under
`accelerate launch -m arithmech.cli finetune ...` each process loads the model onto its own device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.cli.app import app
from arithmech.cli.config_options import config_command
from arithmech.cli.options import QuietOpt, default_out, model_options, setup_logging, within_budget
from arithmech.stages.evaluate_config import EvaluateConfig, trained_split
from arithmech.stages.finetune_config import FinetuneConfig


@app.command()
@model_options
@config_command(FinetuneConfig, flags={"from_run": "--from", "components": ("--components", "--heads")})
def finetune(
    cfg: Any = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Output folder; default <run>/finetune (runs/finetune-<method>-<time> without --from)."),
    ] = None,
    quiet: QuietOpt = False,
    load: Any = None,
) -> None:
    """Fine-tune only the key heads (precise SFT), or the whole model / LoRA as baselines.

    Under AdamW the paper's H / h_l gradient scaling is nearly a no-op; --head-scale learning-rate makes it act.
    """
    setup_logging(quiet)
    from arithmech import preflight
    from arithmech.distributed import local_device

    default = default_out("finetune", cfg.from_run) if cfg.from_run else default_out(f"finetune-{cfg.method}")
    cfg, out_dir = preflight.check(cfg, out or default, "finetune")
    fit = within_budget(load, cfg)
    from arithmech.stages.finetune import finetune as run_finetune

    handle = local_device(load)()
    result = run_finetune(handle, fit.cfg, out_dir, quiet=quiet)
    fit.record(out_dir)
    meta = result.metadata
    speed = meta["samples_per_second"]  # None when no step ran now (a resume of a finished run)
    typer.echo(
        f"{cfg.method}: trained {meta['trainable_parameters']:,} of {meta['total_parameters']:,} parameters, "
        f"{'n/a' if speed is None else f'{speed:.2f}'} samples/s, final loss {meta['final_loss']}"
    )
    typer.echo(f"results in {result.out_dir}")


@app.command()
@model_options
@config_command(EvaluateConfig)
def evaluate(
    cfg: Any = None,
    delta: Annotated[
        Path | None, typer.Option(help="Apply a finetune output folder's delta to the model before evaluating.")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default runs/evaluate-<time>.")] = None,
    quiet: QuietOpt = False,
    load: Any = None,
) -> None:
    """Math (GSM8K, SVAMP, AddSub, SingleEq) and general (MMLU, CommonsenseQA, perplexity/KL) benchmarks,
    and lm-evaluation-harness tasks (--harness-tasks arc_easy,hellaswag)."""
    setup_logging(quiet)
    from arithmech import preflight

    cfg, out_dir = preflight.check(cfg, out or default_out("evaluate"), "evaluate")
    delta_dir = preflight.delta_folder(delta) if delta is not None else None
    split = trained_split(delta_dir) if delta_dir is not None else None
    if delta_dir is not None and split is not None:
        cfg.refuse_other_split(split, f"--delta {str(delta_dir)!r}")
    fit = within_budget(load, cfg)
    from arithmech.stages.evaluate import evaluate_stage

    handle = load()
    record = None
    if delta_dir is not None:
        from arithmech.finetune.delta import apply_delta, delta_record

        apply_delta(handle.model, delta_dir)
        record = delta_record(delta_dir)
        typer.echo(f"evaluating with the {record['method']} finetune delta of {delta_dir} applied "
                   f"({record['tensors']} weight tensors set; recorded in metadata.json)")  # fmt: skip
    result = evaluate_stage(handle, fit.cfg, out_dir, quiet=quiet, delta=record)
    fit.record(out_dir)
    for name, bench in result.benchmarks.items():
        score = "n/a" if bench.accuracy is None else f"{bench.accuracy:.1%}"
        counts = "" if bench.correct is None else f" ({bench.correct} of {bench.n})"
        typer.echo(f"{name:14s} {score}{counts}{_arithmetic_detail(bench.info, bench.n)}, {bench.seconds:.0f} s")
    for harness in result.harness.values():
        for s in harness.scores:
            value = "n/a" if s.value is None else f"{s.value:.4f}"
            typer.echo(f"harness:{s.task} {s.metric} {value} (n={s.n}), {harness.seconds:.0f} s")
    typer.echo(f"results in {out_dir}")


def _arithmetic_detail(info: dict[str, Any], n: int) -> str:
    """What an arithmetic benchmark's accuracy counts; for whole multi-digit numbers, the first digit and the
    per-digit accuracy beside it."""
    if info.get("scored") != "exact":
        return ""
    first, digits = info["first_token_accuracy"], info["token_accuracy"]
    return f" whole numbers; first digit {first:.1%} ({info['first_token_correct']} of {n}), per digit {digits:.1%}"
