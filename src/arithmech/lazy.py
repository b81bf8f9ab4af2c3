"""Package namespaces that import a member on first use.

`from arithmech.data.templates import OPERATIONS` runs `arithmech/data/__init__.py` first; if that imported
every submodule, reading one list of names would load torch (seconds). A package whose members need torch
therefore lists them here instead, and each is imported when it is first looked up. The CLI relies on this:
it builds every command's options from config classes and validates input before anything heavy is imported
(STYLE 15; peft `tuners/ia3/__init__.py` does the same for bitsandbytes).

Usage, in a package's `__init__.py`:
    >>> _EXPORTS = {"generate": ("GenerationConfig", "generate_pairs"), "tokens": ("tokenize_pairs",)}
    >>> __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
    >>> __all__ = sorted(name for names in _EXPORTS.values() for name in names)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` of `package`, whose submodule `exports` keys define the values."""
    home = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(home)

    return __getattr__, __dir__
