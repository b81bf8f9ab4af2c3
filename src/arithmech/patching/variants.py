"""The patching variants by name, importable without torch: configs check a variant before a model loads.

What each variant freezes is explained in `patching/path.py` (Variants); `path_patch` and `attribution_patch`
take one of these names.
"""

from __future__ import annotations

from typing import Literal

Variant = Literal["path", "direct", "total"]
VARIANTS: tuple[str, ...] = ("path", "direct", "total")
