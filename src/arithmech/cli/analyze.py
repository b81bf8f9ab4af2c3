"""`arithmech analyze attention|mlp|fourier|agreement|heuristics|numbers`: what the key heads attend to, what the
MLPs read and write, which frequencies over the number tokens each component writes, how far the methods agree,
which MLP neurons are heuristics, and how the operands are represented (helix, circles, line, digits).

Usage:
    arithmech analyze numbers --high 40 --layers 0,4,8 --sites a,last
    arithmech analyze numbers --families helix,pca,digit-circles --max-prompts 16
    arithmech analyze numbers --sites clock --identify runs/add       # the Clock, identify's heads classified
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.cli.app import analyze_app
from arithmech.cli.config_options import config_command
from arithmech.cli.options import QuietOpt, default_out, ints, model_options, setup_logging, split, within_budget
from arithmech.stages.fourier_config import FourierConfig
from arithmech.stages.heuristics_config import HeuristicsConfig
from arithmech.stages.numbers_config import NumbersConfig


@analyze_app.command("attention")
@model_options
def analyze_attention(
    from_run: Annotated[Path, typer.Option("--from", help="Identify run folder (reference prompts, key heads).")],
    heads: Annotated[str | None, typer.Option(help="Heads to analyse, e.g. 14.2,18.5; default the key heads.")] = None,
    top_k: Annotated[int, typer.Option(help="Heads taken by effect when the run has no key heads.")] = 10,
    tau: Annotated[float, typer.Option(help="Attention mass from END that makes an operand/operator head.")] = 0.3,
    max_prompts: Annotated[int, typer.Option(help="Reference prompts averaged over (a stratified sample).")] = 64,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sample (stratified by operation and template).")] = 0,
    n_examples: Annotated[int, typer.Option(help="Single prompts shown in attention_examples.png.")] = 3,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 16,
    load: Any = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default <run>/attention.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Where each key head looks from the last token: operand A, operand B, operator, prefix (Figures 5, 7)."""
    setup_logging(quiet)
    from arithmech import preflight
    from arithmech.stages.analyze_attention_config import AttentionConfig

    cfg = AttentionConfig(
        heads=split(heads) if heads else None,
        top_k=top_k,
        tau=tau,
        max_prompts=max_prompts,
        n_examples=n_examples,
        batch_size=batch_size,
        seed=seed,
    )
    run_dir, out_dir = preflight.check_reading(
        from_run, out or default_out("attention", from_run), "analyze_attention", one_answer_token=False
    )
    fit = within_budget(load, cfg, run_dir)
    from arithmech.stages.analyze_attention import analyze_attention as run_attention

    handle = load()
    result = run_attention(handle, fit.cfg, run_dir, out_dir, quiet=quiet)  # type: ignore[arg-type]
    fit.record(out_dir)
    typer.echo("head    A     B     op    prefix other  label")
    for head, row, label in zip(result.heads, result.scores.tolist(), result.labels, strict=True):
        typer.echo(f"{head.name:6s} " + " ".join(f"{v:5.2f}" for v in row) + f"  {label}")
    typer.echo(f"results in {result.out_dir}")


@analyze_app.command("mlp")
@model_options
def analyze_mlp(
    from_run: Annotated[Path, typer.Option("--from", help="Identify run folder (its reference prompts).")],
    max_prompts: Annotated[int, typer.Option(help="Reference prompts averaged over (a stratified sample).")] = 256,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sample (stratified by operation and template).")] = 0,
    example_prompt: Annotated[int, typer.Option(help="Index of the prompt drawn in mlp_update_ranks.png.")] = 0,
    layers: Annotated[str | None, typer.Option(help="Comma list of layers; default all.")] = None,
    max_number: Annotated[
        int | None, typer.Option(help="Candidate numbers are 0..max_number; default from the prompts (>= 9).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 16,
    load: Any = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default <run>/mlp.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """MLP logit lens: do MLP inputs point at the operands and MLP updates at the answer (Figure 6)?"""
    setup_logging(quiet)
    from arithmech import preflight
    from arithmech.stages.analyze_mlp_config import AnalyzeMlpConfig

    cfg = AnalyzeMlpConfig(
        max_prompts=max_prompts,
        example_prompt=example_prompt,
        batch_size=batch_size,
        layers=ints(layers, "--layers") if layers else None,
        max_number=max_number,
        seed=seed,
    )
    run_dir, out_dir = preflight.check_reading(from_run, out or default_out("mlp", from_run), "analyze-mlp")
    fit = within_budget(load, cfg, run_dir)
    from arithmech.stages.analyze_mlp import analyze_mlp as run_mlp

    handle = load()
    result = run_mlp(handle, fit.cfg, run_dir, out_dir, quiet=quiet)  # type: ignore[arg-type]
    fit.record(out_dir)
    gap = result.mean["cos_update_C"] - result.mean["cos_update_C_wrong"]
    best = sorted(range(len(result.layers)), key=lambda i: -gap[i])[:5]
    typer.echo(
        "layers whose MLP update points most at the answer C (cos C - mean cos of other numbers): "
        + ", ".join(f"{result.layers[i]} ({gap[i]:+.3f})" for i in best)
    )
    typer.echo(f"results in {result.out_dir}")


@analyze_app.command("fourier")
@model_options
@config_command(FourierConfig)
def analyze_fourier(
    from_run: Annotated[Path, typer.Option("--from", help="Identify run folder (its reference prompts).")],
    cfg: Any = None,
    load: Any = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default <run>/fourier.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Fourier features: the frequencies over the number tokens each attention and MLP output writes, and the
    accuracy with one group's low or high frequencies filtered out (Zhou et al. 2024)."""
    setup_logging(quiet)
    from arithmech import preflight
    from arithmech.stages.fourier import analyze_fourier as run_fourier

    run_dir, out_dir = preflight.check_reading(from_run, out or default_out("fourier", from_run), "analyze-fourier")
    fit = within_budget(load, cfg, run_dir)
    handle = load()
    result = run_fourier(handle, fit.cfg, run_dir, out_dir, quiet=quiet)
    fit.record(out_dir)
    numbers = result.metadata["numbers"]
    available = numbers["single_token_numbers"]
    note = " (a digit-splitting tokenizer)" if numbers["digit_splitting"] else ""
    typer.echo(f"number index 0..{result.n_numbers - 1}: {result.n_numbers} of the {available} single-token "
               f"numbers{note}; frequencies 0..{numbers['max_frequency']}")  # fmt: skip
    for row in result.shares:
        share, mean, sd = (row[k] for k in ("high_share", "random_mean", "random_std"))
        reading = "undefined (no non-constant power)" if share is None or mean is None or sd is None else (
            f"{share:.1%} (flat spectrum {row['flat_share']:.1%}; random directions of the same norms {mean:.1%} "
            f"+- {sd:.1%})")  # fmt: skip
        typer.echo(f"{row['component']:9s} power on f = {row['high_frequencies']}: {reading}")
    for kind, values in result.magnitude.items():
        if values.shape[1] > 1:
            total = values.sum(0)  # [F + 1], summed over layers
            best = int(total[1:].argmax()) + 1  # frequency 0 (the mean over the numbers) left out
            ratio = f"{float(total[0] / total[best]):.1f}x as large" if total[best] > 0 else "the only one"
            typer.echo(f"{kind:9s} strongest frequency over the layers: f = {best} (f = 0, the mean over the "
                       f"numbers, left out: {ratio})")  # fmt: skip
    typer.echo(f"no filter: accuracy {result.baseline['accuracy']:.0%}, P(answer) {result.baseline['answer_prob']:.3f}")
    for row in sorted(result.filters, key=lambda r: (r["accuracy_change"], r["answer_prob_change"]))[:4]:
        typer.echo(f"{row['component']:9s} {row['filter']:9s} cutoff {row['cutoff']}: accuracy {row['accuracy']:.0%} "
                   f"({row['accuracy_change']:+.0%}), P(answer) {row['answer_prob']:.3f}")  # fmt: skip
    typer.echo(f"results in {result.out_dir}")


@analyze_app.command("agreement")
@model_options
def analyze_agreement(
    from_run: Annotated[Path, typer.Option("--from", help="Identify run folder (reference prompts, variant).")],
    methods: Annotated[
        str, typer.Option(help="Comma list of path, attribution, zero-ablation, mediation (at least two).")
    ] = "path,attribution,zero-ablation,mediation",
    max_prompts: Annotated[int, typer.Option(help="Reference prompts every method uses (a stratified sample).")] = 16,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sample (stratified by operation and template).")] = 0,
    ks: Annotated[str, typer.Option(help="Top-k sizes for the overlap columns.")] = "5,10,20",
    batch_size: Annotated[int, typer.Option(help="Rows per forward pass.")] = 16,
    out: Annotated[Path | None, typer.Option(help="Output folder; default <run>/agreement.")] = None,
    quiet: QuietOpt = False,
    load: Any = None,
) -> None:
    """How far path patching, attribution patching, zero ablation and mediation agree (Spearman, top-k overlap)."""
    setup_logging(quiet)
    from arithmech import preflight
    from arithmech.stages.agreement_config import AgreementConfig

    cfg, out_dir = preflight.check(AgreementConfig(
        from_run=str(from_run), methods=split(methods), max_prompts=max_prompts, ks=ints(ks, "--ks"),
        batch_size=batch_size, seed=seed,
    ), out or default_out("agreement", from_run), "agreement")  # fmt: skip
    fit = within_budget(load, cfg)
    from arithmech.stages.agreement import method_agreement

    handle = load()
    result = method_agreement(handle, fit.cfg, out_dir, quiet=quiet)
    fit.record(out_dir)
    typer.echo("level  method A       method B       Spearman  top-10 overlap")
    for row in result.rows:
        overlap = row.get("top10_overlap", float("nan"))
        typer.echo(
            f"{row['level']:6s} {row['method_a']:14s} {row['method_b']:14s} {row['spearman']:8.2f}  {overlap:8.0%}"
        )
    typer.echo(f"results in {result.out_dir}")


@analyze_app.command("heuristics")
@model_options
@config_command(HeuristicsConfig)
def analyze_heuristics(
    cfg: Any = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default runs/heuristics-<time>.")] = None,
    quiet: QuietOpt = False,
    load: Any = None,
) -> None:
    """Heuristic neurons (Nikankin et al. 2025): every MLP neuron's pattern over an operand grid, and ablation."""
    setup_logging(quiet)

    from arithmech import preflight
    from arithmech.stages.heuristics import heuristics

    cfg, out_dir = preflight.check(cfg, out or default_out("heuristics"), "heuristics")
    fit = within_budget(load, cfg)
    handle = load()
    result = heuristics(handle, fit.cfg, out_dir, quiet=quiet)
    fit.record(out_dir)
    one = result.metadata["one_percent_k"]
    k = one if one in result.ks else result.ks[0]
    for op, res in result.operations.items():
        s = res.summary(k)
        ablated = "; ".join(f"{k} top neurons per layer {a}-ablated {s[f'top_{a}']:.0%}, {k} random "
                            f"{s[f'random_{a}']:.0%}" for a in cfg.ablations)  # fmt: skip
        typer.echo(f"{op:15s} {len(res.kept)} pairs; neurons classified: operand templates {s['operand']:.1%} "
                   f"(null {s['operand_null']:.1%}), result templates {s['result']:.1%} (null "
                   f"{s['result_null']:.1%}), both {s['both']:.1%} (null {s['both_null']:.1%}); accuracy "
                   f"{s['base']:.0%} -> {ablated}")  # fmt: skip
    for op, why in result.metadata["skipped"].items():
        typer.echo(f"{op:15s} skipped: {why}")
    typer.echo(f"results in {result.out_dir}")


@analyze_app.command("numbers")
@model_options
@config_command(NumbersConfig, flags={"identify_run": ("--identify", "--from")})
def analyze_numbers(
    cfg: Any = None,
    out: Annotated[Path | None, typer.Option(help="Output folder; default runs/numbers-<time>.")] = None,
    quiet: QuietOpt = False,
    load: Any = None,
) -> None:
    """How the operands are represented (Kantamneni & Tegmark 2025): linear, log, circles, helices, PCA,
    polynomial and per-digit circles fitted per layer at each operand token, each judged by the logit difference
    its patch restores, with held-out, shuffled, other-position and ablation controls; and the Clock at the last
    token (helix(a, b, a+b) against helix(a+b)), with an identify run's heads classified as a,b or a+b heads."""
    setup_logging(quiet)

    from arithmech import preflight
    from arithmech.stages.numbers import analyze_numbers as run_numbers
    from arithmech.stages.numbers_verdict import verdict_sentence

    cfg, out_dir = preflight.check(cfg, out or default_out("numbers"), "analyze-numbers")
    fit = within_budget(load, cfg)
    handle = load()
    result = run_numbers(handle, fit.cfg, out_dir, quiet=quiet)
    fit.record(out_dir)
    span = result.metadata["range"]
    reading = "per digit" if span["digit_split"] else "one token each"
    typer.echo(f"operands {span['low']}..{span['high'] - 1} ({reading}), periods {span['periods']}; forward-pass "
               f"equivalents {result.metadata['forward_pass_equivalents']['total']:.1f}")  # fmt: skip
    for verdict in result.verdicts:
        typer.echo(verdict_sentence(verdict))
    if result.clock is not None:
        for line in [*result.clock.metadata["verdicts"], result.clock.metadata.get("head_order")]:
            if line:
                typer.echo(line)
    typer.echo(f"results in {result.out_dir}")
