"""The typer applications that the command modules register on."""

from __future__ import annotations

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find, explain and improve the parts of a language model that do arithmetic.",
)
analyze_app = typer.Typer(no_args_is_help=True, help="Explain what key heads and MLPs do.")
app.add_typer(analyze_app, name="analyze")


@app.callback()
def _root() -> None:
    """Find, explain and improve the parts of a language model that do arithmetic."""
