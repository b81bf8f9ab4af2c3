"""The command-line reference as Markdown, generated from the typer app itself (the docs' CLI page).

Every command of `arithmech`, in the order of `arithmech --help`, with its usage line, its help text and one
table row per argument and option, each with the help text and default that `--help` prints. The docs build
writes it as cli.md (docs/hooks/cli_reference.py), so the page cannot drift from the commands.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer.main

from arithmech.cli import app


def command_tree() -> Any:
    """The click command behind `arithmech` (typer's own click, not the click package)."""
    return typer.main.get_command(app)


def _commands(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """(command, its context) for `command` and every command under it, depth first in listing order."""
    yield command, ctx
    for name in command.list_commands(ctx) if hasattr(command, "list_commands") else []:
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            yield from _commands(sub, sub.context_class(sub, info_name=name, parent=ctx))


def _text(text: str) -> str:
    """Help text as Markdown shows it: <time> is text, not an HTML tag."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cell(text: str) -> str:
    return _text(text).replace("|", "\\|").replace("\n", " ")


def _rows(command: Any, ctx: Any) -> list[tuple[str, str]]:
    rows = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        record = param.get_help_record(ctx)
        if record is None:  # an argument: its name and help
            record = (param.human_readable_name, getattr(param, "help", "") or "")
        rows.append((record[0], record[1]))
    return rows


def markdown_reference() -> str:
    """The whole reference page: a section per command."""
    root = command_tree()
    ctx = root.context_class(root, info_name="arithmech")
    lines = [
        "# Command-line reference",
        "",
        "Generated from the `arithmech` command-line app at each docs build; `arithmech COMMAND --help` prints "
        "the same text.",
        "",
    ]
    for command, sub in _commands(root, ctx):
        lines += [f"## {sub.command_path}", "", _text(command.help or ""), "", "```text",
                  f"{sub.command_path} {' '.join(command.collect_usage_pieces(sub))}", "```", ""]  # fmt: skip
        rows = _rows(command, sub)
        if rows:
            lines += ["| Argument or option | Meaning |", "| --- | --- |"]
            lines += [f"| `{name}` | {_cell(meaning)} |" for name, meaning in rows] + [""]
    return "\n".join(lines)
