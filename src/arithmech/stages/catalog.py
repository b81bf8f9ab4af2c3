"""Every stage's config class, found by scanning stages/*_config.py, keyed by the "stage" its runs record.

Why: what a stage declares about itself (`STAGE`, the name in its runs' metadata.json, and
`reads_identify_run`, whether a run read an identify run) lives on its config class, one place per stage, and
readers of run folders (`lineage.stale_reason`) look it up here, so no list elsewhere can leave a stage out.
A config module defines one such class: a dataclass with its own `STAGE`.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any

import arithmech.stages


@functools.cache
def stage_configs() -> dict[str, Any]:
    """metadata.json "stage" -> the config class of the stage that writes it, for every stages/*_config.py."""
    found: dict[str, Any] = {}
    for module_info in pkgutil.iter_modules(arithmech.stages.__path__):
        if not module_info.name.endswith("_config"):
            continue
        module = importlib.import_module(f"arithmech.stages.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == module.__name__ and "STAGE" in vars(value):
                found[value.STAGE] = value
    return found
