"""`arithmech mediate` and `arithmech neurons`: the methods of Stolfo et al. and of Yu & Ananiadou.

Options are generated from MediateConfig and NeuronsConfig (cli/config_options.py). mediate splits its pairs
over the processes of `accelerate launch`; rank 0 writes and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.cli.app import app
from arithmech.cli.config_options import config_command
from arithmech.cli.options import QuietOpt, default_out, model_options, setup_logging, within_budget
from arithmech.report.page import SMALL_SAMPLE
from arithmech.report.sections import plural
from arithmech.stages.mediate_config import MediateConfig
from arithmech.stages.neurons_config import NeuronsConfig


@app.command("mediate")
@model_options
@config_command(MediateConfig)
def mediate_command(
    cfg: Any = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default runs/mediate-<time>.")] = None,
    quiet: QuietOpt = False,
    load: Any = None,
) -> None:
    """Causal mediation: indirect effect of every MLP and attention output per layer and position (Stolfo et al.)."""
    setup_logging(quiet)
    from arithmech import distributed, preflight

    cfg, out_dir = preflight.check(cfg, out or default_out("mediate"), "mediate")
    from arithmech.data.mediation_tokens import POSITION_CLASSES
    fit = within_budget(load, cfg)
    from arithmech.stages.mediate import mediate

    handle = distributed.local_device(load)()
    result = mediate(handle, fit.cfg, out_dir, quiet=quiet)
    fit.record(out_dir)
    if not distributed.is_main():
        return
    last = POSITION_CLASSES.index("last")
    for task, res in result.results.items():
        table = res.by_class("median")  # [component, layer, class]
        peaks = []
        for c, name in enumerate(res.components):
            layer = int(table[c, :, last].nan_to_num(float("-inf")).argmax())
            peaks.append(f"{name} layer {res.layers[layer]} ({float(table[c, layer, last]):.2f})")
        typer.echo(f"{task:15s} last-token median IE peaks: {', '.join(peaks)}; TE {res.total_effect.median():.2f} "
                   f"({plural(len(res.total_effect), 'pair')})")  # fmt: skip
    fewest = min(len(res.total_effect) for res in result.results.values())
    if fewest < SMALL_SAMPLE:
        typer.echo(f"small sample: medians of {plural(fewest, 'pair')} change with another sample; use --n-pairs "
                   f"{SMALL_SAMPLE} or more before relying on them")  # fmt: skip
    for (a, b), overlap in result.overlaps.items():
        if a < b:
            typer.echo(f"top-{cfg.neuron_k} neuron overlap at layer {result.neuron_layer}: {a} vs {b} {overlap:.0%}")
    typer.echo(f"results in {result.out_dir}")


@app.command("neurons")
@model_options
@config_command(NeuronsConfig)
def neurons_command(
    cfg: Any = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default runs/neurons-<time>.")] = None,
    quiet: QuietOpt = False,
    load: Any = None,
) -> None:
    """Comparative neuron analysis: head importance per operation, CNA neurons, pruning, LoRA (Yu & Ananiadou)."""
    setup_logging(quiet)
    from arithmech import preflight

    cfg, out_dir = preflight.check(cfg, out or default_out("neurons"), "neurons")
    fit = within_budget(load, cfg)
    from arithmech.stages.neurons import neurons

    handle = load()
    result = neurons(handle, fit.cfg, out_dir, quiet=quiet)
    fit.record(out_dir)
    spec = result.specialisation
    for op, heads in spec.top.items():
        typer.echo(f"{op:15s} top heads {', '.join(h.name for h in heads)} ({spec.share[op]:.0%} of the drop)")
    typer.echo(f"CNA of head {result.head.name}: " + ", ".join(f"{n.layer}_{n.neuron}" for n in result.neurons[:5]))
    for label, sweep in result.pruning.items():
        typer.echo(f"pruning ({label} prompts): " + "; ".join(
            f"keep {r['n_kept']}: {r['top_accuracy']:.0%} vs random {r['random_accuracy_mean']:.0%}"
            for r in sweep.rows()
        ))  # fmt: skip
    typer.echo(f"results in {result.out_dir}")
