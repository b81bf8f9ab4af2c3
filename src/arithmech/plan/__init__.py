"""`arithmech plan`: a stage's planned memory and estimated time from a model's shape, no weights loaded.

shape.py (the sizes and parameter count) <- shape_sources.py (presets.py, config.json, the HF cache, gguf_header.py);
memory.py (bytes per part) and work.py (forward-pass equivalents, from the engines' cost models) <- planner.py (one
stage) <- build.py (the command's options) -> record.py (plan.json and its table); devices.py and sizes.py parse the
device profile and sizes. budget.py fits every stage's batch and chunk sizes to --max-memory from the same plan,
before the stage's model loads (free_memory.py: the default budget, what the device has free).
"""

from arithmech.plan.build import make_plan
from arithmech.plan.presets import PRESETS
from arithmech.plan.record import Plan

__all__ = ["PRESETS", "Plan", "make_plan"]
