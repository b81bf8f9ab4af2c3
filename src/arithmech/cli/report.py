"""`arithmech report RUN_DIR`: one self-contained HTML page with every figure and table of a run.

Examples:
    arithmech report runs/demo                       # -> runs/demo/report.html
    arithmech report runs/demo --out paper/demo.html

Reads only the run folder (never loads a model), so it takes about a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from arithmech.cli.app import app
from arithmech.cli.options import QuietOpt, setup_logging


@app.command("report")
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run folder of `arithmech run` (or of `arithmech identify`).")],
    out: Annotated[Path | None, typer.Option(help="HTML file to write; default <RUN_DIR>/report.html.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Write one HTML report of a run: every stage's figures, key numbers and a reading of them."""
    setup_logging(quiet)
    from arithmech.report.html import write_report

    path = write_report(run_dir, out)
    typer.echo(f"report written to {path}")
