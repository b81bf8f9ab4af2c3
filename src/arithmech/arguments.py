"""The Python API's arguments, checked at the door: a wrong type is one ConfigError sentence, not a traceback.

Background
    The CLI's options are typed by typer and a config file's settings by `config_values`, but a Python caller can
    pass anything: `am.circuit("SmolLM2")` (a name where a loaded model belongs) would fail deep in the stage
    with `AttributeError: 'str' object has no attribute 'view'`, `am.identify(model, out=123)` with a TypeError
    from pathlib. Each public function of `arithmech.api` (and `open_run`) checks its own arguments here first,
    before any folder is made or locked. What is unambiguous is converted: a `str` or `os.PathLike` path becomes
    a Path; a stage's keyword settings are converted by `config_values.typed_settings` (a string of percents
    "1,10,100" becomes (1.0, 10.0, 100.0)).

Checks
    `model_handle`   what `am.load_model()` returns; a name or path says how to load it
    `path`           str or os.PathLike (None where allowed)
    `run_source`     an identify run: a path, or a stage's result (it has .out_dir)
    `flag`           a bool
    `text`           a str (None where allowed)
    `whole`          an int (not a bool), None where allowed
    `size`           a memory size: text ("24GB") or whole bytes, None where allowed
Importing this module imports nothing heavy: a loaded model means torch is loaded already, and a model handle is
recognised without importing it anew.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from arithmech.errors import ConfigError


def _got(value: Any) -> str:
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def model_handle(value: Any, function: str) -> Any:
    """`value` once it is a loaded model (`arithmech.models.load.ModelHandle`)."""
    load = sys.modules.get("arithmech.models.load")  # not imported yet: nothing can be a handle
    if load is not None and isinstance(value, load.ModelHandle):
        return value
    named = isinstance(value, str | os.PathLike)
    how = f"model = am.load_model({str(value)!r})" if named else "model = am.load_model()"
    raise ConfigError(
        f"{function}() takes a loaded model as its first argument, not {_got(value)}; load it first ({how}) and pass "
        "that"
    )


def path(value: Any, name: str, optional: bool = False) -> Path | None:
    """`value` as a Path (a str or os.PathLike); None passes where `optional`."""
    if value is None and optional:
        return None
    if isinstance(value, str | os.PathLike) and not isinstance(value, bytes):
        if not str(value):
            raise ConfigError(f"{name} is an empty path; give a folder, e.g. 'runs/x'")
        return Path(value)
    allowed = "a path (str or pathlib.Path)" + (", or None" if optional else "")
    raise ConfigError(f"{name} takes {allowed}, not {_got(value)}")


def run_source(value: Any, name: str) -> str:
    """An identify run given as its folder (str or os.PathLike) or as the result a stage returned (.out_dir)."""
    folder = getattr(value, "out_dir", value)
    if isinstance(folder, str | os.PathLike) and not isinstance(folder, bytes):
        return str(folder)
    raise ConfigError(f"{name} takes an identify run: its folder (str or Path) or what am.identify() returned, not "
                      f"{_got(value)}")  # fmt: skip


def flag(value: Any, name: str) -> bool:
    """`value` once it is a bool."""
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{name} takes True or False, not {_got(value)}")


def text(value: Any, name: str, optional: bool = False) -> str | None:
    """`value` once it is a str (None where `optional`)."""
    if value is None and optional or isinstance(value, str):
        return value
    raise ConfigError(f"{name} takes text (str){', or None' if optional else ''}, not {_got(value)}")


def whole(value: Any, name: str, optional: bool = False) -> int | None:
    """`value` once it is an int, not a bool (None where `optional`)."""
    if value is None and optional or isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ConfigError(f"{name} takes a whole number (int){', or None' if optional else ''}, not {_got(value)}")


def size(value: Any, name: str) -> str | None:
    """A memory size as text ("24GB"; whole bytes given as an int become "25769803776"); None passes."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{name} takes a size: text such as '24GB', or bytes (int), not {_got(value)}")
