"""Checking a setting against its config field's type, for values that arrive untyped (YAML files, --set).

Background
    The commands' options are typed by typer, but `arithmech run` reads YAML, where `max_k: abc`, `max_k: 8.5`
    or `--set knockout.max_k=abc` are whatever YAML parses them as. Passed on unchecked they fail deep inside a
    stage (`TypeError: '<' not supported`) or, worse, run with a wrong value. `coerce(value, hint, name)`
    returns the value the field takes, or raises ConfigError naming the field and its type.

Accepted, per field type
    bool            true or false (YAML's yes/no too), not 1 or "on" as text
    int             whole numbers, not true/false and not 8.5
    float           any number, not true/false
    str             text, or a whole number (revision: 2 -> "2"); not a decimal (an unquoted 2.10 is read by
                    YAML as 2.1, which names another head) and not true/false
    tuple[X, ...]   a list, a comma string ("addition,multiplication") or a single X; every item as X
    X | None        null, or an X
    dict            a mapping
    anything else   passed on as given

Around it, for `arithmech run`: `read_yaml_mapping` (a config file), `apply_overrides` (the --set KEY=VALUE
pairs, "model: <id>" read as "model: {model: <id>}") and `typed_settings` (a section checked key by key).

Usage
    >>> coerce("abc", int, "knockout.max_k")   # ConfigError: knockout.max_k takes a whole number (int); got 'abc'
    >>> coerce("20,21", tuple[int, ...], "mediation.layers")
    (20, 21)
    >>> typed_settings(KnockoutConfig, {"max_k": "8"}, "knockout")  # ConfigError naming knockout.max_k
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Sequence
from typing import Any

import yaml

from arithmech.errors import ConfigError
from arithmech.preflight import input_file


def optional_base(hint: Any) -> tuple[Any, bool]:
    """(the type of a hint without None, whether None is allowed): `int | None` -> (int, True)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return hint, False


_WORDS = {bool: "true or false (bool)", int: "a whole number (int)", float: "a number (float)", str: "text (str)"}
_PLURALS = {bool: "true/false values", int: "whole numbers", float: "numbers", str: "names"}


def describe(hint: Any) -> str:
    """How a field type reads in a message: "a list of whole numbers (tuple of int), or null"."""
    base, optional = optional_base(hint)
    if typing.get_origin(base) is tuple:
        item = typing.get_args(base)[0]
        text = f"a list of {_PLURALS.get(item, 'values')} (tuple of {getattr(item, '__name__', item)})"
    elif typing.get_origin(base) is dict or base is dict:
        text = "a mapping of settings (dict)"
    else:
        text = _WORDS.get(base, str(base))
    return text + (", or null" if optional else "")


def coerce(value: Any, hint: Any, name: str) -> Any:
    """`value` as the field `name` of type `hint` takes it; ConfigError naming the field and type otherwise."""
    base, optional = optional_base(hint)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name} takes {describe(hint)}; got null")
    try:
        return _as(value, base)
    except ValueError as err:
        detail = f"; {err}" if str(err) else ""
        raise ConfigError(f"{name} takes {describe(hint)}; got {value!r}{detail}") from None


def _as(value: Any, base: Any) -> Any:
    """`value` as type `base`; ValueError (with a hint, or empty) when it is not one."""
    if typing.get_origin(base) is tuple:
        item = typing.get_args(base)[0]
        if isinstance(value, str):  # "20,21": each part read as a number when the items are numbers
            value = [_number(part.strip(), item) for part in value.split(",") if part.strip()]
        elif not isinstance(value, list | tuple):
            value = [value]
        return tuple(_as(v, item) for v in value)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if base is bool and isinstance(value, bool) or base is str and isinstance(value, str):
        return value
    if base is int and number and isinstance(value, int):
        return value
    if base is float and number:
        return float(value)
    if base is str and number:
        if isinstance(value, float):
            raise ValueError("write it in quotes, since YAML reads 2.10 as the number 2.1")
        return str(value)
    if base in (bool, int, float, str) or (typing.get_origin(base) is dict or base is dict) and not isinstance(
        value, dict
    ):
        raise ValueError("")
    return value


def _number(text: str, item: Any) -> Any:
    """A part of a comma string as the item type when that is a number ("20" -> 20), else the text."""
    try:
        return int(text) if item is int else float(text) if item is float else text
    except ValueError:
        return text


def suggest(word: str, choices: Sequence[str]) -> str:
    """"; did you mean 'max_k'?" for a near miss, else the choices."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; choose from {', '.join(choices)}"


def typed_settings(cls: type, values: Any, prefix: str) -> dict[str, Any]:
    """`values` (a YAML section named `prefix`) checked against the fields of dataclass `cls`, key by key."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix} takes a mapping of settings, e.g. '{prefix}: {{seed: 0}}'; got {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in names:
            raise ConfigError(f"{prefix} has no setting {key!r}{suggest(str(key), names)}")
    return {key: coerce(value, hints[key], f"{prefix}.{key}") for key, value in values.items()}


def read_yaml_mapping(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML config file's top-level mapping (a UTF-8 byte-order mark allowed); one ConfigError otherwise."""
    source = input_file(path, "config file")
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8-sig")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {str(source)!r} is not valid YAML ({err.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(source)!r} must be a mapping of settings, e.g. 'out: runs/x'")
    return data


def _model_shorthand(data: dict[str, Any]) -> None:
    if isinstance(data.get("model"), str):  # "model: <id>" is short for "model: {model: <id>}"
        data["model"] = {"model": data["model"]}


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`data` with each "section.key" -> value of `overrides` set (sections created as needed), in place."""
    _model_shorthand(data)
    for key, value in overrides.items():
        target = data
        *parents, leaf = key.split(".")
        for depth, part in enumerate(parents):
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                where = ".".join(parents[: depth + 1])
                raise ConfigError(f"cannot set {key}: {where} is {target!r}, not a mapping of settings")
        target[leaf] = value
        _model_shorthand(data)
    return data
