"""Memory sizes as people write them ("24GB", "80GiB", "512MiB", "1e9"), and back.

Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB, and the bare K, M, G, T that
tools such as `nvidia-smi` and accelerate print) powers of 1024; a bare number is bytes.
"""

from __future__ import annotations

import re

from arithmech.errors import ConfigError

_UNITS = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str, option: str = "--max-memory") -> int:
    """Bytes of a size; one ConfigError sentence for a negative, zero or unparsable one."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(f"{option} takes a size such as 24GB, 80GiB or 512MiB (got {text!r})")
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ConfigError(f"{option} must be a positive size (got {text!r})")
    return int(value)


def format_size(n: float) -> str:
    """1.23 GiB, 456 MiB, 12 KiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if abs(n) < 10 * scale else f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
