"""The `arithmech` command line.

Heavy imports (torch, transformers) happen after parsing, so --help is instant.

Examples:
    arithmech identify                                   # built-in SmolLM2-135M, addition prompts
    arithmech identify --operations addition,multiplication --max-prompts 128 --out runs/add-mul
    arithmech identify --model Qwen/Qwen2.5-0.5B --device cuda --dtype bfloat16
    arithmech identify --model ./my-model-dir --gguf-file model.Q8_0.gguf
    arithmech identify --prompts my_prompts.jsonl --variant direct

Every expected failure ends with one sentence on stderr and exit status 2; Ctrl-C ends with status 130 and
leaves no half-written file.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from arithmech.errors import ArithmechError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find, explain and improve the parts of a language model that do arithmetic.",
)
logger = logging.getLogger("arithmech")

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model", help="Hub id, local folder or .gguf file; default: built-in SmolLM2-135M-Instruct."
    ),
]
GgufOpt = Annotated[str | None, typer.Option("--gguf-file", help="GGUF file name inside the --model folder.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N, or auto (all GPUs).")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32, float16, bfloat16 or auto.")]
RevisionOpt = Annotated[str | None, typer.Option("--revision", help="Hub revision (branch, tag, commit).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="No progress bars or log lines, only results.")]


def _split(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _setup_logging(quiet: bool) -> None:
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO, format="%(message)s", stream=sys.stderr
    )
    for noisy in ("transformers", "accelerate", "huggingface_hub", "urllib3", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _load(model: str | None, gguf_file: str | None, device: str, dtype: str, revision: str | None) -> object:
    from arithmech.models.load import ModelConfig, load_model

    cfg = ModelConfig(model=model, gguf_file=gguf_file, device=device, dtype=dtype, revision=revision)
    start = time.perf_counter()
    handle = load_model(cfg)
    logger.info("loaded %s in %.1f s", handle.source.get("model"), time.perf_counter() - start)
    return handle


@app.callback()
def _root() -> None:
    """Find, explain and improve the parts of a language model that do arithmetic."""


@app.command()
def identify(
    model: ModelOpt = None,
    gguf_file: GgufOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    revision: RevisionOpt = None,
    operations: Annotated[
        str, typer.Option(help="Comma list of addition, subtraction, multiplication, division.")
    ] = "addition",
    formations: Annotated[
        str, typer.Option(help="Comma list of equation, statement, qa.")
    ] = "equation,statement,qa",
    n_per_template: Annotated[int, typer.Option(help="Prompt pairs generated per template.")] = 16,
    few_shot: Annotated[
        int, typer.Option(help="Solved examples of the same template before each query.")
    ] = 3,
    operand_min: Annotated[int, typer.Option(help="Smallest operand.")] = 0,
    operand_max: Annotated[int, typer.Option(help="Largest operand (default single digits).")] = 9,
    prompts: Annotated[
        Path | None,
        typer.Option(help='Your own prompt pairs: JSONL of {"reference", "counterfactual", "answer"}.'),
    ] = None,
    templates: Annotated[
        Path | None, typer.Option(help="Your own templates (JSON list, same fields as the built-in ones).")
    ] = None,
    max_prompts: Annotated[
        int, typer.Option(help="Reference prompts used for patching (sampled by seed).")
    ] = 64,
    keep_incorrect: Annotated[
        bool, typer.Option("--keep-incorrect", help="Also patch prompts the model gets wrong.")
    ] = False,
    variant: Annotated[
        str,
        typer.Option(
            help="path (MLPs recomputed, heads frozen), direct (all frozen) or total (nothing frozen)."
        ),
    ] = "path",
    threshold: Annotated[
        float, typer.Option(help="Key component if effect < threshold (-0.05 = -5%).")
    ] = -0.05,
    fraction_threshold: Annotated[
        float | None,
        typer.Option(
            help="Instead: key if effect >= this fraction of the whole-prompt counterfactual effect."
        ),
    ] = None,
    top_k: Annotated[int, typer.Option(help="Number of components listed as top-k.")] = 10,
    batch_size: Annotated[
        int, typer.Option(help="Prompts per forward pass (lower it if memory is short).")
    ] = 16,
    seed: Annotated[int, typer.Option(help="Seed for prompt generation and sampling.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Run folder; default runs/identify-<time>.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Path-patch every attention head and MLP at the last token and write the key components."""
    _setup_logging(quiet)
    from arithmech.stages.identify import IdentifyConfig
    from arithmech.stages.identify import identify as run_identify

    cfg = IdentifyConfig(
        operations=_split(operations), formations=_split(formations), n_per_template=n_per_template,
        few_shot=few_shot, operand_min=operand_min, operand_max=operand_max,
        prompts_file=str(prompts) if prompts else None, templates_file=str(templates) if templates else None,
        max_prompts=max_prompts,
        filter_correct=not keep_incorrect, variant=variant, threshold=threshold,
        fraction_threshold=fraction_threshold, top_k=top_k, batch_size=batch_size, seed=seed,
    )
    if cfg.prompts_file is None:
        cfg.generation()  # validate before the model loads
        if cfg.templates_file:
            from arithmech.data import load_templates

            load_templates(cfg.templates_file)
    handle = _load(model, gguf_file, device, dtype, revision)
    out_dir = out or Path("runs") / time.strftime("identify-%Y%m%d-%H%M%S")
    result = run_identify(handle, cfg, out_dir, quiet=quiet)  # type: ignore[arg-type]
    _print_identify_summary(result)


def _print_identify_summary(result: object) -> None:
    key = result.key  # type: ignore[attr-defined]
    heads = [r for r in key.ranked if r.component.head is not None][:10]
    mlps = [r for r in key.ranked if r.component.head is None][:5]
    counts = result.metadata["counts"]  # type: ignore[attr-defined]
    typer.echo(
        f"reference set: {counts['used']} prompts ({counts['answered_correctly']} of "
        f"{counts['pairs'] - counts['rejected_length_mismatch']} answered correctly); "
        f"whole-prompt counterfactual effect {key.total_effect:+.1%}"
    )
    typer.echo("top heads:  " + ", ".join(f"{r.component.name} ({r.effect:+.1%})" for r in heads))
    typer.echo("top MLPs:   " + ", ".join(f"{r.component.name} ({r.effect:+.1%})" for r in mlps))
    typer.echo(f"key components ({key.rule}): {', '.join(r.component.name for r in key.key) or 'none'}")
    typer.echo(f"results in {result.out_dir}")  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status (testable without a subprocess)."""
    try:
        code = app(args=argv, standalone_mode=False)  # the exit code when a command exits early, e.g. 130
    except ArithmechError as err:
        typer.echo(f"error: {err}", err=True)
        return 2
    except KeyboardInterrupt:
        typer.echo("interrupted; no half-written files were left", err=True)
        return 130
    except typer.Exit as done:
        return int(done.exit_code or 0)
    except Exception as err:  # usage errors of the (vendored) click inside typer
        if hasattr(err, "show") and isinstance(getattr(err, "exit_code", None), int):
            err.show()
            return err.exit_code
        raise
    if code == 130:
        typer.echo("interrupted; no half-written files were left", err=True)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
