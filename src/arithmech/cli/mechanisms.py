"""`arithmech mediate` and `arithmech neurons`: the methods of Stolfo et al. and of Yu & Ananiadou.

Options are generated from MediateConfig and NeuronsConfig (cli/config_options.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.cli.app import app
from arithmech.cli.config_options import config_command
from arithmech.cli.options import QuietOpt, model_options, setup_logging
from arithmech.stages.neurons import NeuronsConfig


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
    from arithmech.stages.neurons import neurons

    handle = load()
    result = neurons(handle, cfg, out or Path("runs") / time.strftime("neurons-%Y%m%d-%H%M%S"), quiet=quiet)
    spec = result.specialisation
    for op, heads in spec.top.items():
        typer.echo(f"{op:15s} top heads {', '.join(h.name for h in heads)} ({spec.share[op]:.0%} of the drop)")
    typer.echo(f"CNA of head {result.head.name}: " + ", ".join(f"{n.layer}_{n.neuron}" for n in result.neurons[:5]))
    rows = result.pruning.rows()
    typer.echo("pruning: " + "; ".join(
        f"keep {r['n_kept']}: {r['top_accuracy']:.0%} vs random {r['random_accuracy_mean']:.0%}" for r in rows
    ))  # fmt: skip
    typer.echo(f"results in {result.out_dir}")
