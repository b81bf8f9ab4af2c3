"""Read a GGUF file's metadata and tensor names, never its tensors (the GGUF v2/v3 layout of ggml's gguf.md).

The `gguf` package's GGUFReader also parses every array (the tokenizer's 49k tokens and merges) into numpy: 4 s on
the default model, too slow for a planner. This reads the header in one pass, skipping what it does not keep.

Layout: magic "GGUF", version u32, tensor count u64, key-value count u64; each key-value a string key, a u32 type
and its value (arrays: element type u32, count u64, elements); then each tensor's name, n_dims u32, dims u64 x
n_dims, type u32 and offset u64. Strings are a u64 length and UTF-8 bytes; everything is little-endian.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from arithmech.errors import ConfigError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Bad(Exception):
    """The file ends early or holds a type this layout does not have."""


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) < size:
        raise _Bad("the file ends inside its header")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    if n > 1 << 24:
        raise _Bad(f"a string of {n} bytes")
    data = f.read(n)
    if len(data) < n:
        raise _Bad("the file ends inside its header")
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        inner, count = _read(f, "<I"), _read(f, "<Q")
        if inner in _SCALARS and not keep:
            f.seek(struct.calcsize(_SCALARS[inner]) * count, 1)
            return count
        values = [_value(f, inner, keep) for _ in range(count)]
        return values if keep else count
    raise _Bad(f"value type {kind}")


def read_gguf_header(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """(metadata, tensor names) of a GGUF file; arrays are kept as their length. One ConfigError sentence when the
    file is not a GGUF file this layout reads."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise _Bad("it does not start with GGUF")
            version = _read(f, "<I")
            if version not in (2, 3):
                raise _Bad(f"GGUF version {version} (this reads 2 and 3)")
            n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = _string(f)
                meta[key] = _value(f, _read(f, "<I"), keep=False)
            names = []
            for _ in range(n_tensors):
                names.append(_string(f))
                f.seek(8 * _read(f, "<I") + 4 + 8, 1)  # dims, type, offset
    except OSError as err:
        raise ConfigError(f"cannot read GGUF file {str(path)!r}: {err.strerror or err}") from None
    except (_Bad, struct.error) as err:
        raise ConfigError(f"cannot read GGUF file {str(path)!r} as a model's shape: {err}") from None
    return meta, names
