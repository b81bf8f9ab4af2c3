"""CLI options generated from a stage's config dataclass, so a setting is declared (with its help) once.

Each field becomes --field-name with the field's help metadata; tuples are given as comma lists
("--mlps 20,21"), booleans as --flag/--no-flag, and None defaults stay None when the option is not given.
The command receives the built config object as `cfg`; building it runs the config's own validation, so bad
values fail with its one-sentence ConfigError before any model loads.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

from arithmech.cli.options import ints, split
from arithmech.config_values import optional_base


def _option(
    field: dataclasses.Field, hint: Any, flags: str | tuple[str, ...]
) -> tuple[Any, Any, Callable[[Any], Any]]:
    """(annotation, default, converter from the CLI value to the config value) of one field; `flags` is its option
    name, or its names (the first shown first, e.g. ("--components", "--heads"))."""
    names = (flags,) if isinstance(flags, str) else flags
    flag = names[0]
    base, optional = optional_base(hint)
    help_text = field.metadata.get("help", "")
    default = field.default if field.default is not dataclasses.MISSING else None
    if typing.get_origin(base) is tuple:
        of_ints = typing.get_args(base)[:1] == (int,)
        text = None if default is None else ",".join(str(v) for v in default)
        annotation = Annotated[str | None, typer.Option(*names, help=f"{help_text} (comma list)")]

        def convert(value: Any, name: str = flag, of_ints: bool = of_ints) -> Any:
            if value is None:
                return None
            return ints(value, name) if of_ints else split(value)

        return annotation, text, convert
    if base is bool:
        annotation = Annotated[bool, typer.Option(f"{flag}/--no-{flag[2:]}", help=help_text)]
        return annotation, bool(default), lambda value: value
    kind = base if base in (int, float, str) else str
    annotation = Annotated[kind | None if optional or default is None else kind, typer.Option(*names, help=help_text)]
    return annotation, default, lambda value: value


def config_command(
    config_cls: type, exclude: tuple[str, ...] = (), flags: dict[str, str | tuple[str, ...]] | None = None
) -> Callable[[Callable[..., Any]], Callable]:
    """Decorate `command(cfg, **other options)`: the config's fields become its options, built into `cfg`.

    `flags` renames options (e.g. {"from_run": "--from"}) or gives one several names (a tuple); the default is
    --field-name.
    """
    hints = typing.get_type_hints(config_cls, include_extras=True)
    fields = [f for f in dataclasses.fields(config_cls) if f.init and f.name not in exclude]
    flags = flags or {}
    specs = {f.name: _option(f, hints[f.name], flags.get(f.name, "--" + f.name.replace("_", "-"))) for f in fields}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own_hints = typing.get_type_hints(command, include_extras=True)
        signature = inspect.signature(command)
        kept = [
            p.replace(annotation=own_hints[n], kind=inspect.Parameter.KEYWORD_ONLY)
            for n, p in signature.parameters.items()
            if n != "cfg"
        ]
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            for name, (annotation, default, _) in specs.items()
        ]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            values = {name: specs[name][2](kwargs.pop(name)) for name in specs}
            given = {name: value for name, value in values.items() if value is not None or _nullable(hints[name])}
            return command(cfg=config_cls(**given), **kwargs)

        wrapper.__signature__ = signature.replace(parameters=[*added, *kept])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {**{p.name: p.annotation for p in added}, **{p.name: p.annotation for p in kept}}
        del wrapper.__wrapped__  # typer must see the generated signature
        return wrapper

    return decorate


def _nullable(hint: Any) -> bool:
    return optional_base(hint)[1]
