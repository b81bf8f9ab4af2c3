"""`arithmech circuit`: edge-level circuits on MIB's arithmetic prompts, scored by faithfulness.

Edges are scored on find pairs and circuits evaluated on disjoint test pairs (MIB: found on train, evaluated on
validation); --in-sample evaluates on the find pairs instead, and says so in every table.

Examples:
    arithmech circuit --method eap-ig --operations addition --out runs/circuit-add     # scores every edge
    arithmech circuit --from runs/circuit-add --evaluate --out runs/circuit-add        # sweep on its test pairs
    arithmech circuit --method random --evaluate --out runs/circuit-random             # the baseline, 3 seeds
    arithmech circuit --circuit-file other-tool/importances.json                       # another tool's circuit
    arithmech circuit --method path-patching --identify runs/add --evaluate            # identify's heads as a circuit
    arithmech circuit --evaluate --compare-methods path-patching,random --identify runs/add   # side by side
    arithmech circuit --from runs/circuit-add --draw-percent 0.2 --out runs/circuit-draw      # circuit.svg, 0.2 %
    arithmech circuit --mib-dataset mib-bench/arithmetic_addition --evaluate           # MIB's own prompts
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from arithmech.cli.app import app
from arithmech.cli.options import QuietOpt, model_options, setup_logging, split, within_budget


def _floats(text: str) -> tuple[float, ...]:
    from arithmech.errors import ConfigError

    try:
        return tuple(float(part) for part in split(text))
    except ValueError:
        raise ConfigError(f"--percents takes numbers separated by commas, e.g. 0.1,1,10,100 (got {text!r})") from None


@app.command()
@model_options
def circuit(
    method: Annotated[
        str | None,
        typer.Option(help="Edge ranking: eap, eap-ig (MIB's baseline; the default), path-patching (--identify) or "
                          "random. Not with --from or --circuit-file, which keep the folder's or the file's."),
    ] = None,
    compare_methods: Annotated[
        str,
        typer.Option(help="Further rankings, scored on the same find pairs and swept on the same test pairs "
                          "(with --evaluate): path-patching, random."),
    ] = "",
    identify_run: Annotated[
        Path | None, typer.Option("--identify", help="Identify run whose node ranking path-patching turns into edges.")
    ] = None,
    operations: Annotated[str, typer.Option(help="MIB tasks whose prompts are pooled: addition, subtraction.")] = (
        "addition"
    ),
    n_prompts: Annotated[
        int, typer.Option(help="Find pairs the edges are scored on (the model answers both prompts of each).")
    ] = 32,
    test_prompts: Annotated[
        int | None,
        typer.Option(help="Held-out test pairs the circuits are evaluated on, disjoint from the find pairs by fact "
                          "(MIB data: by split); default as many as --n-prompts."),
    ] = None,
    in_sample: Annotated[
        bool,
        typer.Option("--in-sample", help="Evaluate on the pairs the edges were scored on (no held-out pairs); every "
                                         "table, the figure and the report then say in-sample."),
    ] = False,
    random_seeds: Annotated[
        int, typer.Option(help="Seeds of the random ranking; its CPR and CMD are their mean, sd, min and max.")
    ] = 3,
    steps: Annotated[int, typer.Option(help="EAP-IG interpolation steps (MIB uses 5).")] = 5,
    ablation: Annotated[str, typer.Option(help="What edges outside the circuit carry: counterfactual or mean.")] = (
        "counterfactual"
    ),
    evaluate: Annotated[bool, typer.Option("--evaluate", help="Sweep faithfulness over circuit sizes (CPR, CMD).")] = (
        False
    ),
    percents: Annotated[
        str, typer.Option(help="Circuit sizes of the sweep, % of edges.")
    ] = "0.1,0.2,0.5,1,2,5,10,20,50,100",
    circuit_percent: Annotated[
        float, typer.Option(help="Size of the circuit marked in_graph in edges.json, % of edges, ranked by "
                                 "--circuit-ranking.")
    ] = 5.0,
    circuit_ranking: Annotated[
        str,
        typer.Option(help="How the in_graph circuit is ranked: signed (the top edges by score, CPR's ranking; an "
                          "edge with a large negative score is left out) or absolute (by |score|, CMD's)."),
    ] = "signed",
    draw_percent: Annotated[
        float | None,
        typer.Option(
            help="Size of the drawn circuit (circuit.svg), % of edges; default the smallest swept circuit "
            "with f >= 0.8, else the top 200 edges; at most 500 edges are drawn."
        ),
    ] = None,
    from_circuit: Annotated[
        Path | None,
        typer.Option("--from", help="Circuit folder whose edge scores and find and test pairs are reused."),
    ] = None,
    circuit_file: Annotated[
        Path | None,
        typer.Option(help="A circuit file in MIB's format from any tool, evaluated on the test pairs: its in_graph "
                          "circuit, and the sweep by its scores when it scores every edge."),
    ] = None,
    oracle: Annotated[
        int, typer.Option(help="Exact scores of the top N edges and N random ones, against the method's (0: off).")
    ] = 0,
    compare: Annotated[
        list[Path] | None,
        typer.Option("--compare", help="Other circuit folders (with faithfulness.csv) drawn in the figure; repeat."),
    ] = None,
    keep_incorrect: Annotated[
        bool, typer.Option("--keep-incorrect", help="Keep prompts whose scored token the model does not predict.")
    ] = False,
    mib_dataset: Annotated[
        str | None,
        typer.Option(help="MIB's own data: mib-bench/arithmetic_addition (or _subtraction), or a local copy of it."),
    ] = None,
    mib_split: Annotated[str, typer.Option(help="Split of --mib-dataset the edges are scored on (MIB: train).")] = (
        "train"
    ),
    mib_eval_split: Annotated[
        str,
        typer.Option(help="Split the circuits are evaluated on (MIB evaluates on validation); rows sharing a prompt "
                          "with the find split are dropped."),
    ] = "validation",
    mib_eval_dataset: Annotated[
        str | None,
        typer.Option(help="The evaluation rows, when --mib-dataset is one file without splits (e.g. MIB's "
                          "validation split as .jsonl)."),
    ] = None,
    min_prompts: Annotated[
        int, typer.Option(help="Fewest pairs that may survive the answer filter; fewer is refused.")
    ] = 4,
    max_operand: Annotated[int, typer.Option(help="Largest operand of the prompts.")] = 99,
    batch_size: Annotated[int, typer.Option(help="Prompts per patched forward pass.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of the prompts and of the random ranking.")] = 0,
    load: Any = None,
    out: Annotated[Path | None, typer.Option(help="Run folder; default runs/circuit-<time>.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Score every edge of MIB's graph and measure how faithful the top circuits are (MIB's CPR and CMD)."""
    setup_logging(quiet)
    from arithmech import preflight
    from arithmech.stages.circuit_config import CircuitConfig

    cfg, out_dir = preflight.check(CircuitConfig(
        method=method,
        compare_methods=split(compare_methods),
        identify_run=str(identify_run) if identify_run else None,
        operations=split(operations),
        n_prompts=n_prompts,
        test_prompts=test_prompts,
        in_sample=in_sample,
        random_seeds=random_seeds,
        steps=steps,
        ablation=ablation,
        evaluate=evaluate,
        percents=_floats(percents),
        circuit_percent=circuit_percent,
        circuit_ranking=circuit_ranking,
        draw_percent=draw_percent,
        from_circuit=str(from_circuit) if from_circuit else None,
        circuit_file=str(circuit_file) if circuit_file else None,
        oracle=oracle,
        compare=tuple(str(p) for p in compare or ()),
        keep_incorrect=keep_incorrect,
        mib_dataset=mib_dataset,
        mib_split=mib_split,
        mib_eval_split=mib_eval_split,
        mib_eval_dataset=mib_eval_dataset,
        min_prompts=min_prompts,
        max_operand=max_operand,
        batch_size=batch_size,
        seed=seed,
    ), out or Path("runs") / time.strftime("circuit-%Y%m%d-%H%M%S"), "circuit")  # fmt: skip
    fit = within_budget(load, cfg)
    from arithmech.stages.circuit import circuit as run_circuit

    result = run_circuit(load(), fit.cfg, out_dir, quiet=quiet)
    fit.record(out_dir)
    evaluated = f"{result.n_test} {result.pairs} pairs" if result.n_test is not None else "no test pairs"
    typer.echo(f"graph: {result.n_edges:,} edges (MIB's count); {result.n_prompts} find pairs; evaluated on "
               f"{evaluated}; ranking: {result.method}")  # fmt: skip
    for part, counts in (result.filtered or {}).items():
        for seen in counts:
            typer.echo(f"answer filter ({part}), {seen.describe()}")
    if result.file_circuit is not None:
        row = result.file_circuit
        typer.echo(f"the file's circuit ({row['edges']:,} edges, {row['percent']:.2f} %): f = {row['f']:.3f} on "
                   f"{row['prompts']} {row['pairs']} pairs (m = {row['m']:.3f}, m(full) = {row['m_full']:.3f}, "
                   f"m(empty) = {row['m_empty']:.3f})")  # fmt: skip
    if result.sweep is not None:
        sweep = result.sweep
        typer.echo(f"on the {result.pairs} pairs: m(full) = {sweep.m_full:.3f}, m(empty) = {sweep.m_empty:.3f}")
        typer.echo("     k %   edges  f (signed)  f (|score|)")
        for k, n, fs, fa in zip(sweep.percents, sweep.edges, sweep.f_signed, sweep.f_absolute, strict=True):
            typer.echo(f"{k:8.1f}  {n:6d}  {fs:10.3f}  {fa:11.3f}")
    for row in result.summary or ():
        spread = f" (mean of seeds {row['seeds']}; CPR sd {row['cpr_sd'] or 0:.3f}, CMD sd {row['cmd_sd'] or 0:.3f})"
        typer.echo(f"{row['method']}: CPR {row['cpr']:.3f} (signed ranking, higher is better), CMD {row['cmd']:.3f} "
                   f"(|score| ranking, lower is better), {row['pairs']}{spread if row['seeds'] else ''}")  # fmt: skip
    if result.oracle is not None:
        agree = result.oracle
        typer.echo(f"exact scores of {agree['edges']} edges: Spearman {agree['spearman']:.3f} with the method's, "
                   f"top-{len_top(agree)} overlap {agree['top_n_overlap']:.0%} (oracle.csv)")  # fmt: skip
    typer.echo(f"results in {result.out_dir}")


def len_top(agreement: dict[str, Any]) -> int:
    return int(agreement["edges"]) // 2
