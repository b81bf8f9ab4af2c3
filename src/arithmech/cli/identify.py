"""`arithmech identify`: path-patch every head and MLP and write the key components.

Under `accelerate launch --num_processes N -m arithmech.cli identify ...` the prompts are split over the
processes (each on its own GPU with --device cuda) and rank 0 writes the run folder and prints the summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.cli.app import app
from arithmech.cli.options import QuietOpt, default_out, model_options, setup_logging, split, within_budget
from arithmech.report.page import SMALL_SAMPLE


@app.command()
@model_options
def identify(
    load: Any = None,
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
    answer_digits: Annotated[
        bool,
        typer.Option(
            "--answer-digits",
            help="Score answers of several tokens (12 = '1', '2' on digit-splitting tokenizers) token by token, "
            "each on the prompt plus the answer's earlier tokens; effects per answer place (units, tens, ...) too; "
            "every answer token must be one digit",
        ),
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
    setup_logging(quiet)
    from arithmech import distributed, preflight
    from arithmech.stages.identify_config import IdentifyConfig

    cfg, out_dir = preflight.check(IdentifyConfig(
        operations=split(operations),
        formations=split(formations),
        n_per_template=n_per_template,
        few_shot=few_shot,
        operand_min=operand_min,
        operand_max=operand_max,
        prompts_file=str(prompts) if prompts else None,
        templates_file=str(templates) if templates else None,
        max_prompts=max_prompts,
        filter_correct=not keep_incorrect,
        answer_digits=answer_digits,
        variant=variant,
        method=method,
        threshold=threshold,
        fraction_threshold=fraction_threshold,
        top_k=top_k,
        batch_size=batch_size,
        seed=seed,
    ), out or default_out("identify"), "identify")
    fit = within_budget(load, cfg)
    from arithmech.stages.identify import identify as run_identify

    handle = distributed.local_device(load)()
    result = run_identify(handle, fit.cfg, out_dir, quiet=quiet)  # type: ignore[arg-type]
    fit.record(out_dir)
    if distributed.is_main():
        _print_identify_summary(result)


def _print_identify_summary(result: object) -> None:
    from arithmech.stages.identify import reference_counts

    key = result.key  # type: ignore[attr-defined]
    heads = [r for r in key.ranked if r.component.head is not None][:10]
    mlps = [r for r in key.ranked if r.component.head is None][:5]
    counts = result.metadata["counts"]  # type: ignore[attr-defined]
    filtered = result.metadata["config"].get("filter_correct", True)  # type: ignore[attr-defined]
    typer.echo(f"reference set: {reference_counts(counts, filtered)}; "
               f"whole-prompt counterfactual effect {key.total_effect:+.1%}")  # fmt: skip
    typer.echo("top heads:  " + ", ".join(f"{r.component.name} ({r.effect:+.1%})" for r in heads))
    typer.echo("top MLPs:   " + ", ".join(f"{r.component.name} ({r.effect:+.1%})" for r in mlps))
    names = ", ".join(r.component.name for r in key.key) or f"none: {key.why_none}"
    typer.echo(f"key components ({key.rule}): {names}")
    agreement = result.metadata.get("agreement")  # type: ignore[attr-defined]
    if agreement:
        rho = {k: "n/a" if v is None else f"{v:.2f}" for k, v in agreement.items()}  # None: a constant ranking
        typer.echo(
            f"attribution vs exact: Spearman {rho['spearman_all']} (heads {rho['spearman_heads']},"
            f" MLPs {rho['spearman_mlps']})"
            + "".join(f", {k.replace('_overlap', '')} overlap {v:.0%}" for k, v in agreement.items() if "overlap" in k)
        )
    places = result.metadata.get("answer_places")  # type: ignore[attr-defined]
    if places:
        typer.echo("answer digits scored per place: " + ", ".join(f"{p}: {n}" for p, n in places.items()))
        carry = result.metadata.get("carry_accuracy") or {}  # type: ignore[attr-defined]
        if carry:
            typer.echo("answered before sampling: " + ", ".join(
                f"{group} {v['accuracy']:.0%} of {v['pairs']}" for group, v in carry.items()))  # fmt: skip
        overlap = _first_overlap(result.out_dir)  # type: ignore[attr-defined]
        if overlap:
            typer.echo(overlap)
    if counts["used"] < SMALL_SAMPLE:
        typer.echo(f"small sample: effects of {counts['used']} prompts change with another sample; use "
                   f"{SMALL_SAMPLE} or more (--max-prompts, --n-per-template) before relying on them")  # fmt: skip
    typer.echo(f"results in {result.out_dir}")  # type: ignore[attr-defined]


def _first_overlap(out: Path) -> str | None:
    """One line on how much the first two answer places (units and tens) share their top components."""
    import csv

    path = out / "place_overlap.csv"
    if not path.is_file():
        return None
    with path.open() as handle:
        row = next(csv.DictReader(handle))
    k = "top10_overlap" if "top10_overlap" in row else next(c for c in row if c.endswith("_overlap"))
    rho = f"{float(row['spearman']):.2f}" if row["spearman"] else "n/a"  # empty: a constant ranking
    return (f"answer {row['place_a']} and {row['place_b']} digits: {k.removesuffix('_overlap')} overlap "
            f"{float(row[k]):.0%}, Spearman {rho}")  # fmt: skip
