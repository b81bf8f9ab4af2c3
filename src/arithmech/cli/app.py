"""The typer applications that the command modules register on.

Help is plain click text (rich_markup_mode=None): option help is shown as written, so "pip install
'arithmech[lm-eval]'" keeps its brackets, and flags show no value placeholder.
"""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},  # subcommands inherit it
    help="Find, explain and improve the parts of a language model that do arithmetic.",
)
analyze_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Explain what key heads and MLPs do.")
app.add_typer(analyze_app, name="analyze")


def version_line() -> str:
    """'arithmech 0.1.0 (git 0123abcd4567)': the installed version, and the commit of a source checkout."""
    import importlib.metadata

    from arithmech import __version__
    from arithmech.runs import git_sha

    try:
        version = importlib.metadata.version("arithmech")
    except importlib.metadata.PackageNotFoundError:
        version = __version__
    sha = git_sha()
    return f"arithmech {version}" + (f" (git {sha[:12]})" if sha else "")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
) -> None:
    """Find, explain and improve the parts of a language model that do arithmetic."""
