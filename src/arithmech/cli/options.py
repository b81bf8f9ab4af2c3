"""Options shared by every command: the model to load, logging, and comma-separated lists.

`model_options` adds --model, --gguf-file, --device, --dtype, --revision, --threads and --max-memory to a command
and hands the command one `load` function instead, so the seven options are declared once. `load` honours the
command's --quiet: no library progress bars either. `within_budget(load, cfg)` fits the stage's sizes to
--max-memory (plan/budget.py) from the model's shape, before `load()` reads a weight.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.errors import ConfigError

logger = logging.getLogger("arithmech")

QuietOpt = Annotated[bool, typer.Option("--quiet", help="No progress bars or log lines, only results.")]

_MODEL_PARAMS: list[tuple[str, Any, Any]] = [
    (
        "model",
        Annotated[
            str | None,
            typer.Option(
                "--model",
                help="Hub id, local folder or .gguf file; default: built-in SmolLM2-135M-Instruct (the Q4_1 "
                "GGUF, dequantized to float32).",
            ),
        ],
        None,
    ),
    (
        "gguf_file",
        Annotated[str | None, typer.Option("--gguf-file", help="GGUF file name inside the --model folder.")],
        None,
    ),
    ("device", Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N, or auto (all GPUs).")], "cpu"),
    ("dtype", Annotated[str, typer.Option("--dtype", help="float32, float16, bfloat16 or auto.")], "float32"),
    ("revision", Annotated[str | None, typer.Option("--revision", help="Hub revision (branch, tag, commit).")], None),
    (
        "threads",
        Annotated[
            int | None,
            typer.Option(
                "--threads",
                min=1,
                help="CPU threads torch uses; default torch's own (one per core). Another busy process on the "
                "same cores slows a scan many times over: give each job its own cores.",
            ),
        ],
        None,
    ),
    (
        "max_memory",
        Annotated[
            str | None,
            typer.Option(
                "--max-memory",
                metavar="SIZE",
                help="Memory the stage may use on its device, e.g. 24GB or 80GiB: batch and chunk sizes are lowered "
                "to fit its planned peak (`arithmech plan`), and a stage that cannot fit stops before the model "
                "loads. Default: the device's free memory (CPU: the available system memory).",
            ),
        ],
        None,
    ),
]


def model_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give `command` the model options; it receives `load`, a function returning the loaded ModelHandle."""
    hints = typing.get_type_hints(command, include_extras=True)  # resolved in the command's own module
    signature = inspect.signature(command)
    kept = [p.replace(annotation=hints[name]) for name, p in signature.parameters.items() if name != "load"]
    added = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=t) for n, t, d in _MODEL_PARAMS]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        chosen = {name: kwargs.pop(name) for name, _, _ in _MODEL_PARAMS}
        return command(load=functools.partial(load_handle, **chosen, quiet=bool(kwargs.get("quiet"))), **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*kept, *added])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**{p.name: p.annotation for p in kept}, **{n: t for n, t, _ in _MODEL_PARAMS}}
    del wrapper.__wrapped__  # typer must see the new signature, not the command's
    return wrapper


def load_handle(
    model: str | None,
    gguf_file: str | None,
    device: str,
    dtype: str,
    revision: str | None,
    threads: int | None = None,
    max_memory: str | None = None,
    quiet: bool = False,
) -> Any:
    """Load the model named by the options, logging where it came from and how long it took."""
    from arithmech.models.load import load_model, set_threads

    cfg = model_config(model, gguf_file, device, dtype, revision, max_memory)
    set_threads(threads)
    start = time.perf_counter()
    handle = load_model(cfg, quiet=quiet)
    logger.info("loaded %s in %.1f s", handle.source.get("model"), time.perf_counter() - start)
    return handle


def model_config(
    model: str | None, gguf_file: str | None, device: str, dtype: str, revision: str | None, max_memory: str | None
) -> Any:
    """The `ModelConfig` of the model options (imported here: a command's --help needs none of it)."""
    from arithmech.models.model_config import ModelConfig

    return ModelConfig(model=model, gguf_file=gguf_file, device=device, dtype=dtype, revision=revision,
                       max_memory=max_memory)  # fmt: skip


def within_budget(load: Any, cfg: Any, identify_run: Any = None) -> Any:
    """`cfg` with its sizes fitted to --max-memory (a `plan.budget.BudgetFit`: `.cfg`, `.record(out)`), from the
    model's shape before `load` loads it; a stage that cannot fit is one ConfigError sentence now. `identify_run`:
    the run folder an analysis reads, where its config does not name it (its prompts set the widest batch)."""
    from arithmech.plan.budget import before_load, fit_or_keep

    options = {k: v for k, v in load.keywords.items() if k not in ("threads", "quiet")}
    return fit_or_keep(before_load(model_config(**options)), cfg, identify=identify_run)


def split(text: str) -> tuple[str, ...]:
    """'a, b,c' -> ('a', 'b', 'c')."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


def ints(text: str, option: str) -> tuple[int, ...]:
    """'20,21' -> (20, 21), or one sentence naming the option."""
    try:
        return tuple(int(part) for part in split(text))
    except ValueError:
        raise ConfigError(f"{option} takes whole numbers separated by commas, e.g. 20,21,22 (got {text!r})") from None


def setup_logging(quiet: bool) -> None:
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
    for noisy in ("transformers", "accelerate", "huggingface_hub", "urllib3", "httpx", "lm_eval"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def default_out(stage: str, from_run: str | Path | None = None) -> Path:
    """Where a command writes when --out is not given: an analysis of a run (--from) into <run>/<stage>, as
    attention, mlp and fourier do, so that `arithmech report <run>` shows it; anything else into
    runs/<stage>-<time>."""
    if from_run is not None:
        return Path(from_run) / stage
    return Path("runs") / time.strftime(f"{stage}-%Y%m%d-%H%M%S")
