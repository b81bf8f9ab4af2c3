"""`arithmech knockout` and `arithmech transfer`: do the key components matter, and elsewhere too?

knockout splits its prompts over the processes of `accelerate launch`; rank 0 writes and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.cli.app import app
from arithmech.cli.options import QuietOpt, default_out, model_options, setup_logging, split, within_budget


@app.command()
@model_options
def knockout(
    from_run: Annotated[
        Path | None, typer.Option("--from", help="Identify run folder: its ranking and reference prompts.")
    ] = None,
    components: Annotated[
        str | None, typer.Option(help="Ranked components to knock out instead, e.g. 14.2,18.5,mlp.20.")
    ] = None,
    ablation: Annotated[str, typer.Option(help="mean (over the counterfactual set), zero or resample.")] = "mean",
    end_only: Annotated[bool, typer.Option("--end-only", help="Ablate at the last token only.")] = False,
    max_k: Annotated[
        int | None,
        typer.Option(help="Largest number of components knocked out (k = 1, 2, ...); default 16, or all --components."),
    ] = None,
    n_random: Annotated[int, typer.Option(help="Random-rank draws (seeds) per k.")] = 5,
    include_mlps: Annotated[bool, typer.Option("--include-mlps", help="Rank and draw MLPs as well as heads.")] = False,
    max_prompts: Annotated[
        int, typer.Option(help="Prompts scored per prompt set (a sample stratified by operation and template).")
    ] = 64,
    held_out: Annotated[
        bool,
        typer.Option(
            "--held-out/--no-held-out",
            help="With --from: also knock out on held-out prompts (the run's templates, facts its ranking never "
            "saw), reported first; --no-held-out scores the ranked prompts only.",
        ),
    ] = True,
    min_group_size: Annotated[
        int, typer.Option(help="Smallest template group a mean is taken over (or resampled from); smaller: END mean.")
    ] = 4,
    answer_digits: Annotated[
        bool,
        typer.Option(
            "--answer-digits",
            help="Score answers of several tokens token by token (on by itself for an identify run made with it).",
        ),
    ] = False,
    batch_size: Annotated[int, typer.Option(help="Rows (configuration x prompt) per forward pass.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed of the random-rank draws.")] = 0,
    load: Any = None,
    out: Annotated[
        Path | None, typer.Option(help="Output folder; default <run>/knockout (runs/knockout-<time> without --from).")
    ] = None,
    quiet: QuietOpt = False,
) -> None:
    """Knock out the top-k components by effect vs k random ones and record accuracy (paper Figure 3)."""
    setup_logging(quiet)
    from arithmech import distributed, preflight
    from arithmech.stages.knockout_config import KnockoutConfig

    cfg, out_dir = preflight.check(KnockoutConfig(
        from_run=str(from_run) if from_run else None,
        components=split(components) if components else None,
        ablation=ablation,
        end_only=end_only,
        max_k=max_k,
        n_random=n_random,
        include_mlps=include_mlps,
        max_prompts=max_prompts,
        held_out=held_out,
        min_group_size=min_group_size,
        answer_digits=answer_digits,
        batch_size=batch_size,
        seed=seed,
    ), out or default_out("knockout", from_run), "knockout")
    fit = within_budget(load, cfg)
    from arithmech.stages.knockout import knockout as run_knockout

    handle = distributed.local_device(load)()
    result = run_knockout(handle, fit.cfg, out_dir, quiet=quiet)  # type: ignore[arg-type]
    fit.record(out_dir)
    if distributed.is_main():
        _echo_knockout(result)


def _echo_knockout(result: Any) -> None:
    """The curve of every prompt set, held out first, and which prompts each holds."""
    from arithmech.data.places import place_name
    from arithmech.stages.knockout_outputs import baseline, prompt_set_order, summarize

    counts = result.metadata["counts"]["prompts"]
    typer.echo(f"prompt sets: {result.metadata['split']}")
    for prompt_set in prompt_set_order(result.rows):
        rows = result.curve(prompt_set)
        base = baseline(rows, prompt_set)
        whole = " (whole answers, every token right)" if base.by_place else ""
        name = "" if prompt_set == "unranked" else f"{prompt_set.replace('_', '-')}, "
        typer.echo(f"{name}{counts[prompt_set]} prompts: accuracy with nothing knocked out {base.accuracy:.1%}{whole}")
        typer.echo("   k  effect-rank  random-rank (mean ± sd)")
        for row in summarize(rows):
            mean, sd = row["random_accuracy_mean"], row["random_accuracy_std"]  # NaN with no draws; sd with one
            spread = f"{sd:.1%}" if sd == sd else "n/a (one draw)"
            random_rank = f"{mean:10.1%} ± {spread}" if mean == mean else f"{'n/a':>10s} (--n-random 0)"
            typer.echo(f"{row['k']:4d}  {row['effect_accuracy']:10.1%}  {random_rank}")
        if base.by_place:
            top = max(r.k for r in rows)
            at = [(p, a) for r in rows if r.k == top and r.ranking == "effect"
                  for p, g, _, a, _ in r.by_place if p is not None and g == "all"]  # fmt: skip
            typer.echo(f"per answer digit with the top {top} out (the earlier digits given): "
                       + ", ".join(f"{place_name(p)} {a:.1%}" for p, a in at) + " (knockout_place_summary.csv)")
    typer.echo(f"results in {result.out_dir}")


@app.command()
@model_options
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
    max_prompts: Annotated[int, typer.Option(help="Answered prompts scored per target set (stratified sample).")] = 32,
    min_group_size: Annotated[
        int, typer.Option(help="Smallest template group a mean is taken over (or resampled from); smaller: END mean.")
    ] = 4,
    limit: Annotated[int, typer.Option(help="Word-problem rows considered per target set.")] = 200,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Folder holding svamp/ and gsm8k/ (default $ARITHMECH_DATA, then the shipped copies)."),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Rows (configuration x prompt) per forward pass.")] = 32,
    seed: Annotated[int, typer.Option(help="Seed of generation, sampling and random draws.")] = 0,
    load: Any = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default <first --from run>/transfer.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Knock out components found on one prompt set on other sets: formations, operations, word problems."""
    setup_logging(quiet)
    from arithmech import preflight
    from arithmech.stages.transfer_config import DEFAULT_TARGETS, TransferConfig

    cfg, out_dir = preflight.check(TransferConfig(
        sources=tuple(str(p) for p in from_runs),
        targets=split(targets) if targets else DEFAULT_TARGETS,
        k=k,
        include_mlps=include_mlps,
        ablation=ablation,
        end_only=end_only,
        n_random=n_random,
        max_prompts=max_prompts,
        min_group_size=min_group_size,
        limit=limit,
        data_dir=str(data_dir) if data_dir else None,
        batch_size=batch_size,
        seed=seed,
    ), out or default_out("transfer", from_runs[0]), "transfer")
    fit = within_budget(load, cfg)
    from arithmech.stages.transfer import transfer as run_transfer

    handle = load()
    result = run_transfer(handle, fit.cfg, out_dir, quiet=quiet)  # type: ignore[arg-type]
    fit.record(out_dir)
    for source in result.metadata["sources"]:
        typer.echo(f"{source['path']}: knocked out {', '.join(source['components'])}: {source['why']}")
    typer.echo("source -> target: n, accuracy drop effect-rank vs random-rank")
    for row in result.rows:
        typer.echo(
            f"{row.source} -> {row.target}: n={row.n_prompts}, {row.effect_drop:.0%} vs {row.random_drop:.0%}"
            + (f" ({row.note})" if row.note else "")
        )
    typer.echo(f"results in {result.out_dir}")
