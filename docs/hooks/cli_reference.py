"""mkdocs hook: the command-line reference page (cli.md), generated from the arithmech app at each build."""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    from arithmech.cli.reference import markdown_reference

    files.append(File.generated(config, "cli.md", content=markdown_reference()))
    return files
