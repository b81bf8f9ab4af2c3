"""The `arithmech` command line.

Heavy imports (torch, transformers) happen after parsing, so --help is instant.

Examples:
    arithmech identify                                   # built-in SmolLM2-135M, addition prompts
    arithmech identify --operations addition,multiplication --max-prompts 128 --out runs/add-mul
    arithmech identify --model Qwen/Qwen2.5-0.5B --device cuda --dtype bfloat16
    arithmech identify --model ./my-model-dir --gguf-file model.Q8_0.gguf
    arithmech identify --prompts my_prompts.jsonl --variant direct

Every expected failure ends with one sentence on stderr and exit status 2; Ctrl-C ends with status 130 and
leaves no half-written file.
"""

from __future__ import annotations

import sys

import typer

from arithmech.cli import analyze, identify, improve, mechanisms, pipeline, report, validate  # noqa: F401  (each registers its commands)
from arithmech.cli.app import app
from arithmech.errors import ArithmechError

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status (testable without a subprocess)."""
    try:
        code = app(args=argv, standalone_mode=False)  # the exit code when a command exits early, e.g. 130
    except ArithmechError as err:
        typer.echo(f"error: {err}", err=True)
        return 2
    except KeyboardInterrupt:
        typer.echo("interrupted; no half-written files were left", err=True)
        return 130
    except typer.Exit as done:
        return int(done.exit_code or 0)
    except Exception as err:  # usage errors of the (vendored) click inside typer
        if hasattr(err, "show") and isinstance(getattr(err, "exit_code", None), int):
            err.show()
            return err.exit_code
        raise
    if code == 130:
        typer.echo("interrupted; no half-written files were left", err=True)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
