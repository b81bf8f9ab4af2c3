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

from arithmech.errors import ArithmechError, ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find, explain and improve the parts of a language model that do arithmetic.",
)
logger = logging.getLogger("arithmech")

ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="Hub id, local folder or .gguf file; default: built-in SmolLM2-135M-Instruct."),
]
GgufOpt = Annotated[str | None, typer.Option("--gguf-file", help="GGUF file name inside the --model folder.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N, or auto (all GPUs).")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32, float16, bfloat16 or auto.")]
RevisionOpt = Annotated[str | None, typer.Option("--revision", help="Hub revision (branch, tag, commit).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", help="No progress bars or log lines, only results.")]


def _split(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in _split(text))
    except ValueError:
        raise ConfigError(f"{option} takes whole numbers separated by commas, e.g. 20,21,22 (got {text!r})") from None


def _setup_logging(quiet: bool) -> None:
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
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
    formations: Annotated[str, typer.Option(help="Comma list of equation, statement, qa.")] = "equation,statement,qa",
    n_per_template: Annotated[int, typer.Option(help="Prompt pairs generated per template.")] = 16,
    few_shot: Annotated[int, typer.Option(help="Solved examples of the same template before each query.")] = 3,
    operand_min: Annotated[int, typer.Option(help="Smallest operand.")] = 0,
    operand_max: Annotated[int, typer.Option(help="Largest operand (default single digits).")] = 9,
    prompts: Annotated[
        Path | None,
        typer.Option(help='Your own prompt pairs: JSONL of {"reference", "counterfactual", "answer"}.'),
    ] = None,
    templates: Annotated[
        Path | None, typer.Option(help="Your own templates (JSON list, same fields as the built-in ones).")
    ] = None,
    max_prompts: Annotated[int, typer.Option(help="Reference prompts used for patching (sampled by seed).")] = 64,
    keep_incorrect: Annotated[
        bool, typer.Option("--keep-incorrect", help="Also patch prompts the model gets wrong.")
    ] = False,
    variant: Annotated[
        str,
        typer.Option(help="path (MLPs recomputed, heads frozen), direct (all frozen) or total (nothing frozen)."),
    ] = "path",
    method: Annotated[
        str,
        typer.Option(
            help="exact (path patching), attribution (first-order estimate from one forward and one backward "
            "pass), or both (and their agreement: Spearman, top-k overlap)."
        ),
    ] = "exact",
    threshold: Annotated[float, typer.Option(help="Key component if effect < threshold (-0.05 = -5%).")] = -0.05,
    fraction_threshold: Annotated[
        float | None,
        typer.Option(help="Instead: key if effect >= this fraction of the whole-prompt counterfactual effect."),
    ] = None,
    top_k: Annotated[int, typer.Option(help="Number of components listed as top-k.")] = 10,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass (lower it if memory is short).")] = 16,
    seed: Annotated[int, typer.Option(help="Seed for prompt generation and sampling.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Run folder; default runs/identify-<time>.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Path-patch every attention head and MLP at the last token and write the key components."""
    _setup_logging(quiet)
    from arithmech.stages.identify import IdentifyConfig
    from arithmech.stages.identify import identify as run_identify

    cfg = IdentifyConfig(
        operations=_split(operations),
        formations=_split(formations),
        n_per_template=n_per_template,
        few_shot=few_shot,
        operand_min=operand_min,
        operand_max=operand_max,
        prompts_file=str(prompts) if prompts else None,
        templates_file=str(templates) if templates else None,
        max_prompts=max_prompts,
        filter_correct=not keep_incorrect,
        variant=variant,
        method=method,
        threshold=threshold,
        fraction_threshold=fraction_threshold,
        top_k=top_k,
        batch_size=batch_size,
        seed=seed,
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
    agreement = result.metadata.get("agreement")  # type: ignore[attr-defined]
    if agreement:
        typer.echo(
            f"attribution vs exact: Spearman {agreement['spearman_all']:.2f} (heads {agreement['spearman_heads']:.2f},"
            f" MLPs {agreement['spearman_mlps']:.2f})"
            + "".join(f", {k.replace('_overlap', '')} overlap {v:.0%}" for k, v in agreement.items() if "overlap" in k)
        )
    typer.echo(f"results in {result.out_dir}")  # type: ignore[attr-defined]


@app.command()
def knockout(
    from_run: Annotated[
        Path | None, typer.Option("--from", help="Identify run folder: its ranking and reference prompts.")
    ] = None,
    components: Annotated[
        str | None, typer.Option(help="Ranked components to knock out instead, e.g. 14.2,18.5,mlp.20.")
    ] = None,
    ablation: Annotated[str, typer.Option(help="mean (over the counterfactual set), zero or resample.")] = "mean",
    end_only: Annotated[bool, typer.Option("--end-only", help="Ablate at the last token only.")] = False,
    max_k: Annotated[int, typer.Option(help="Largest number of components knocked out (k = 1, 2, 4, ...).")] = 16,
    n_random: Annotated[int, typer.Option(help="Random-rank draws (seeds) per k.")] = 5,
    include_mlps: Annotated[bool, typer.Option("--include-mlps", help="Rank and draw MLPs as well as heads.")] = False,
    max_prompts: Annotated[int, typer.Option(help="Reference prompts used.")] = 64,
    batch_size: Annotated[int, typer.Option(help="Rows (configuration x prompt) per forward pass.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed of the random-rank draws.")] = 0,
    model: ModelOpt = None,
    gguf_file: GgufOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    revision: RevisionOpt = None,
    out: Annotated[Path | None, typer.Option(help="Run folder; default runs/knockout-<time>.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Knock out the top-k components by effect vs k random ones and record accuracy (paper Figure 3)."""
    _setup_logging(quiet)
    from arithmech.stages.knockout import KnockoutConfig, summarize
    from arithmech.stages.knockout import knockout as run_knockout

    cfg = KnockoutConfig(
        from_run=str(from_run) if from_run else None,
        components=_split(components) if components else None,
        ablation=ablation,
        end_only=end_only,
        max_k=max_k,
        n_random=n_random,
        include_mlps=include_mlps,
        max_prompts=max_prompts,
        batch_size=batch_size,
        seed=seed,
    )
    handle = _load(model, gguf_file, device, dtype, revision)
    out_dir = out or Path("runs") / time.strftime("knockout-%Y%m%d-%H%M%S")
    result = run_knockout(handle, cfg, out_dir, quiet=quiet)  # type: ignore[arg-type]
    base = next(r for r in result.rows if r.ranking == "none")
    typer.echo(f"accuracy with nothing knocked out: {base.accuracy:.1%}")
    typer.echo("   k  effect-rank  random-rank (mean ± sd)")
    for row in summarize(result.rows):
        typer.echo(
            f"{row['k']:4d}  {row['effect_accuracy']:10.1%}  "
            f"{row['random_accuracy_mean']:10.1%} ± {row['random_accuracy_std']:.1%}"
        )
    typer.echo(f"results in {result.out_dir}")


@app.command()
def transfer(
    from_runs: Annotated[
        list[Path], typer.Option("--from", help="Identify run folder(s) whose components are knocked out; repeat.")
    ],
    targets: Annotated[
        str | None,
        typer.Option(
            help="Comma list of target sets: addition, subtraction-qa, multidigit-addition, decimals-addition, "
            "svamp, gsm8k, ... (default: the four operations, a formation change, multi-digit, decimals, SVAMP, "
            "GSM8K)."
        ),
    ] = None,
    k: Annotated[int | None, typer.Option(help="Components knocked out; default the source's key heads.")] = None,
    include_mlps: Annotated[bool, typer.Option("--include-mlps", help="Rank and draw MLPs too.")] = False,
    ablation: Annotated[str, typer.Option(help="mean, zero or resample.")] = "mean",
    end_only: Annotated[bool, typer.Option("--end-only", help="Ablate at the last token only.")] = False,
    n_random: Annotated[int, typer.Option(help="Random-rank control seeds.")] = 5,
    max_prompts: Annotated[int, typer.Option(help="Answered prompts used per target set.")] = 32,
    limit: Annotated[int, typer.Option(help="Word-problem rows considered per target set.")] = 200,
    data_dir: Annotated[
        Path | None, typer.Option(help="Folder holding svamp/ and gsm8k/ (default $ARITHMECH_DATA or ../shared/data).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Rows (configuration x prompt) per forward pass.")] = 32,
    seed: Annotated[int, typer.Option(help="Seed of generation, sampling and random draws.")] = 0,
    model: ModelOpt = None,
    gguf_file: GgufOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    revision: RevisionOpt = None,
    out: Annotated[Path | None, typer.Option(help="Run folder; default runs/transfer-<time>.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Knock out components found on one prompt set on other sets: formations, operations, word problems."""
    _setup_logging(quiet)
    from arithmech.stages.transfer import DEFAULT_TARGETS, TransferConfig
    from arithmech.stages.transfer import transfer as run_transfer

    cfg = TransferConfig(
        sources=tuple(str(p) for p in from_runs),
        targets=_split(targets) if targets else DEFAULT_TARGETS,
        k=k,
        include_mlps=include_mlps,
        ablation=ablation,
        end_only=end_only,
        n_random=n_random,
        max_prompts=max_prompts,
        limit=limit,
        data_dir=str(data_dir) if data_dir else None,
        batch_size=batch_size,
        seed=seed,
    )
    handle = _load(model, gguf_file, device, dtype, revision)
    out_dir = out or Path("runs") / time.strftime("transfer-%Y%m%d-%H%M%S")
    result = run_transfer(handle, cfg, out_dir, quiet=quiet)  # type: ignore[arg-type]
    typer.echo("source -> target: n, accuracy drop effect-rank vs random-rank")
    for row in result.rows:
        typer.echo(
            f"{row.source} -> {row.target}: n={row.n_prompts}, {row.effect_drop:.0%} vs {row.random_drop:.0%}"
            + (f" ({row.note})" if row.note else "")
        )
    typer.echo(f"results in {result.out_dir}")


analyze_app = typer.Typer(no_args_is_help=True, help="Explain what key heads and MLPs do.")
app.add_typer(analyze_app, name="analyze")


@analyze_app.command("attention")
def analyze_attention(
    from_run: Annotated[Path, typer.Option("--from", help="Identify run folder (reference prompts, key heads).")],
    heads: Annotated[str | None, typer.Option(help="Heads to analyse, e.g. 14.2,18.5; default the key heads.")] = None,
    top_k: Annotated[int, typer.Option(help="Heads taken by effect when the run has no key heads.")] = 10,
    tau: Annotated[float, typer.Option(help="Attention mass from END that makes an operand/operator head.")] = 0.3,
    max_prompts: Annotated[int, typer.Option(help="Reference prompts averaged over.")] = 64,
    n_examples: Annotated[int, typer.Option(help="Single prompts shown in attention_examples.png.")] = 3,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 16,
    model: ModelOpt = None,
    gguf_file: GgufOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    revision: RevisionOpt = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default <run>/attention.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Where each key head looks from the last token: operand A, operand B, operator, prefix (Figures 5, 7)."""
    _setup_logging(quiet)
    from arithmech.stages.analyze_attention import AttentionConfig
    from arithmech.stages.analyze_attention import analyze_attention as run_attention

    cfg = AttentionConfig(
        heads=_split(heads) if heads else None,
        top_k=top_k,
        tau=tau,
        max_prompts=max_prompts,
        n_examples=n_examples,
        batch_size=batch_size,
    )
    handle = _load(model, gguf_file, device, dtype, revision)
    result = run_attention(handle, cfg, from_run, out or from_run / "attention", quiet=quiet)  # type: ignore[arg-type]
    typer.echo("head    A     B     op    prefix other  label")
    for head, row, label in zip(result.heads, result.scores.tolist(), result.labels, strict=True):
        typer.echo(f"{head.name:6s} " + " ".join(f"{v:5.2f}" for v in row) + f"  {label}")
    typer.echo(f"results in {result.out_dir}")


@analyze_app.command("mlp")
def analyze_mlp(
    from_run: Annotated[Path, typer.Option("--from", help="Identify run folder (its reference prompts).")],
    max_prompts: Annotated[int, typer.Option(help="Reference prompts averaged over.")] = 256,
    example_prompt: Annotated[int, typer.Option(help="Index of the prompt drawn in mlp_update_ranks.png.")] = 0,
    layers: Annotated[str | None, typer.Option(help="Comma list of layers; default all.")] = None,
    max_number: Annotated[
        int | None, typer.Option(help="Candidate numbers are 0..max_number; default from the prompts (>= 9).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 16,
    model: ModelOpt = None,
    gguf_file: GgufOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    revision: RevisionOpt = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default <run>/mlp.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """MLP logit lens: do MLP inputs point at the operands and MLP updates at the answer (Figure 6)?"""
    _setup_logging(quiet)
    from arithmech.stages.analyze_mlp import AnalyzeMlpConfig
    from arithmech.stages.analyze_mlp import analyze_mlp as run_mlp

    cfg = AnalyzeMlpConfig(
        max_prompts=max_prompts,
        example_prompt=example_prompt,
        batch_size=batch_size,
        layers=_ints(layers, "--layers") if layers else None,
        max_number=max_number,
    )
    handle = _load(model, gguf_file, device, dtype, revision)
    result = run_mlp(handle, cfg, from_run, out or from_run / "mlp", quiet=quiet)  # type: ignore[arg-type]
    gap = result.mean["cos_update_C"] - result.mean["cos_update_C_wrong"]
    best = sorted(range(len(result.layers)), key=lambda i: -gap[i])[:5]
    typer.echo(
        "layers whose MLP update points most at the answer C (cos C - mean cos of other numbers): "
        + ", ".join(f"{result.layers[i]} ({gap[i]:+.3f})" for i in best)
    )
    typer.echo(f"results in {result.out_dir}")


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
