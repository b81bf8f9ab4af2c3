"""Hand a benchmark's measurements to `compare.py` (`make bench`) without changing what the script prints.

Each benchmark script ends with `record(name, args, metrics)`. When the environment variable
ARITHMECH_BENCH_RECORD names a file, one JSON line {"benchmark", "metrics", "args"} is appended to it; run by
hand (the variable unset), the call does nothing.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from typing import Any

RECORD_ENV = "ARITHMECH_BENCH_RECORD"


def record(benchmark: str, args: argparse.Namespace, metrics: Mapping[str, Any]) -> None:
    """Append `metrics` (numbers, flags; a table's rows as a list) and the script's arguments to the record file,
    if one is named; the arguments say which measurements are comparable (a speedup on 16 prompts is not one on
    64)."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    line = {"benchmark": benchmark, "metrics": dict(metrics), "args": vars(args)}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, default=str) + "\n")
