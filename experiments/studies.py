"""The studies behind docs/results.md and the README's findings: what runs them and which of their files are kept.

Every number those pages quote is rendered from a committed file under results/ (experiments/render_results.py),
never typed. A `Source` is the commands of one study, run into a scratch folder (runs/results/<source> by
default); each `Kept` names a run folder of it and the small tables (CSV/JSON) to keep from it, which land, with
that folder's metadata.json, in results/<study>/<run>/. results/<study>/study.json says which commands made them,
when, at which commit, how long they took and on which model file.

    python experiments/results.py run demo           # rerun a source and refresh its results/ folders
    python experiments/results.py collect demo       # refresh them from runs/results/demo as it is

`quick` is the same study at a few prompts on a tiny model: tests/integration/test_results_quick.py runs it in CI
and renders the study's pages from its files, so that a changed output format fails there, not at the next
refresh. `{runs}` is the scratch folder and `{model}` the tiny model's folder.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kept:
    """Files kept from one run folder of a source, into results/<study>/<name>/."""

    study: str
    name: str
    """The run folder's name under results/<study>/ (its path under the source's scratch folder is `path`)."""
    path: str
    files: tuple[str, ...]
    metadata: bool = True
    """Keep the run folder's metadata.json (config, seed, versions, git sha, model)."""


@dataclass(frozen=True)
class Source:
    """The commands of a study, the run folders they write, and how long they take."""

    name: str
    commands: tuple[str, ...]
    quick: tuple[str, ...]
    kept: tuple[Kept, ...]
    figures: tuple[tuple[str, str], ...] = ()
    """(a figure of a run folder, its copy under docs/figures/) for the pages that show it."""


_SMALL_DEMO = (
    "--set stages=[identify,knockout,transfer,attention,mlp,fourier,mediation,agreement,neurons,heuristics,circuit] "
    "--set identify.filter_correct=false --set identify.max_prompts=8 --set identify.n_per_template=2 "
    "--set knockout.max_k=2 --set knockout.n_random=1 --set knockout.max_prompts=4 "
    "--set transfer.n_random=1 --set transfer.max_prompts=4 --set transfer.limit=3 --set transfer.n_per_template=2 "
    "--set transfer.filter_correct=false --set attention.max_prompts=4 --set mlp.max_prompts=4 "
    "--set mediation.tasks=[addition] --set mediation.formats=[equation] --set mediation.neuron_k=3 "
    "--set mediation.n_pairs=2 --set agreement.max_prompts=4 --set neurons.max_prompts=2 "
    "--set neurons.filter_correct=false --set neurons.importance_layers=[1,2] --set neurons.keep_sizes=[0,8] "
    "--set neurons.n_random=1 --set neurons.lora_steps=1 --set neurons.lora_rank=2 --set neurons.top_neurons=4 "
    "--set neurons.top_heads=2 --set neurons.few_shot=1 --set fourier.max_prompts=4 "
    "--set heuristics.operations=[addition,division] --set heuristics.filter_correct=false "
    "--set heuristics.few_shot=1 --set heuristics.max_pairs=12 --set heuristics.layers=[1] --set heuristics.ks=[1,2] "
    "--set heuristics.n_random=2 --set heuristics.top_neurons=2 --set heuristics.batch_size=8 "
    "--set circuit.keep_incorrect=true --set circuit.n_prompts=2 --set circuit.percents=[1,10,100] "
    "--set circuit.batch_size=2 --set circuit.steps=2"
)
"""Every demo stage on a few prompts of a tiny model (its outputs have the real run's format, not its numbers)."""

_NUMBERS = "--families linear,circle-10,helix-10,digit-linear,digit-circles,pca-1,pca-2,pca-3,pca-4 --shuffles 2"
"""The numbers study's families: the rival readings of two-digit operands (a linear value, the circle and helix of
period 10, a linear code and a circle mod 10 per digit), the PCA of each one's size (1 to 4), two shuffled-order
controls each reading. At every fifth layer of the default model and 32 prompts per site it fits in well
under an hour on one CPU thread (every third layer with ten families, tried first, had patched one and a half of its
seven sites when it was stopped after 17 minutes, under a concurrent test suite; every layer and family would take
many hours; the measured time is in results/numbers/study.json)."""

SOURCES: dict[str, Source] = {
    source.name: source
    for source in (
        Source(
            name="demo",
            commands=(
                "arithmech run --config configs/default-model.yaml --out {runs}/demo",
                "arithmech analyze fourier --from {runs}/demo/identify --max-prompts 64 --out {runs}/fourier-64",
                "arithmech analyze heuristics --operations addition --layers 20,21,22,23,24,25,26,27,28,29 --ks 15 "
                "--n-random 2 --ablations mean --out {runs}/heuristics-addition",
            ),
            quick=(
                "arithmech run --config configs/default-model.yaml --model {model} --out {runs}/demo " + _SMALL_DEMO,
                "arithmech analyze fourier --from {runs}/demo/identify --model {model} --max-prompts 4 "
                "--cutoffs 1 --out {runs}/fourier-64",
                "arithmech analyze heuristics --model {model} --operations addition --layers 1 --ks 1 --n-random 1 "
                "--ablations mean --no-filter-correct --few-shot 1 --max-pairs 12 --out {runs}/heuristics-addition",
            ),
            kept=(
                Kept("identify", "identify", "demo/identify",
                     ("effects.csv", "key_components.json", "template_accuracy.csv", "agreement.json")),
                Kept("identify", "pipeline", "demo", ("pipeline.json",), metadata=False),
                Kept("knockout", "knockout", "demo/knockout", ("knockout_summary.csv",)),
                Kept("knockout", "attention", "demo/attention", ("attention_roles.csv",)),
                Kept("knockout", "mlp", "demo/mlp", ("mlp_cosines.csv", "mlp_update_ranks.csv")),
                Kept("transfer", "transfer", "demo/transfer", ("transfer.csv",)),
                Kept("fourier", "fourier", "fourier-64",
                     ("fourier_shares.csv", "fourier_filters.csv", "fourier_spectrum.csv")),
                Kept("heuristics", "defaults", "demo/heuristics", ("layers.csv", "ablation.csv")),
                Kept("heuristics", "addition", "heuristics-addition", ("layers.csv", "ablation.csv")),
                Kept("mediation-neurons", "mediation", "demo/mediation",
                     ("mediation_total.csv", "mediation_by_class.csv", "neuron_overlap.csv")),
                Kept("mediation-neurons", "agreement", "demo/agreement", ("agreement.csv",)),
                Kept("mediation-neurons", "neurons", "demo/neurons",
                     ("head_importance.csv", "specialisation.json", "cna_neurons.csv", "pruning.csv",
                      "lora_coefficients.csv")),
                Kept("circuits", "demo", "demo/circuit", ("cpr_cmd.csv", "faithfulness.csv")),
            ),  # fmt: skip
            figures=(("demo/identify/effects_heatmap.png", "demo-effects-heatmap.png"),),
        ),
        Source(
            name="per-digit",
            commands=(
                "arithmech identify --answer-digits --operand-min 10 --operand-max 49 --n-per-template 48 "
                "--max-prompts 64 --out {runs}/addition",
                "arithmech knockout --from {runs}/addition --max-k 16 --n-random 3 --out {runs}/addition-knockout",
                "arithmech analyze attention --from {runs}/addition --heads 14.2,18.5,20.8,20.6,20.2 "
                "--out {runs}/addition-attention",
            ),
            quick=(
                "arithmech identify --model {model} --answer-digits --operand-min 10 --operand-max 49 "
                "--n-per-template 4 --max-prompts 8 --keep-incorrect --out {runs}/addition",
                "arithmech knockout --model {model} --from {runs}/addition --max-k 2 --n-random 1 "
                "--out {runs}/addition-knockout",
                "arithmech analyze attention --model {model} --from {runs}/addition --heads 0.1,1.2 "
                "--out {runs}/addition-attention",
            ),
            kept=(
                Kept("per-digit", "identify", "addition",
                     ("effects_by_place.csv", "place_overlap.csv", "template_accuracy.csv", "key_components.json")),
                Kept("per-digit", "knockout", "addition-knockout",
                     ("knockout_summary.csv", "knockout_place_summary.csv")),
                Kept("per-digit", "attention", "addition-attention", ("attention_by_place.csv",)),
            ),  # fmt: skip
        ),
        Source(
            name="numbers",
            commands=(
                "arithmech identify --operations addition --max-prompts 64 --out {runs}/identify",
                f"arithmech analyze numbers --layers 0,5,10,15,20,25 {_NUMBERS} --max-prompts 32 "
                "--from {runs}/identify --out {runs}/numbers",
            ),
            quick=(
                "arithmech identify --model {model} --operations addition --n-per-template 4 --max-prompts 8 "
                "--keep-incorrect --out {runs}/identify",
                f"arithmech analyze numbers --model {{model}} --layers 1 {_NUMBERS} --max-prompts 6 "
                "--no-filter-correct --max-pairs 40 --few-shot 1 --batch-size 4 --from {runs}/identify "
                "--out {runs}/numbers",
            ),
            kept=(
                Kept("numbers", "identify", "identify", ("key_components.json", "effects.csv")),
                Kept("numbers", "numbers", "numbers",
                     ("numbers_ld.csv", "numbers_periods.json", "numbers_clock.csv", "numbers_clock_heads.csv")),
            ),  # fmt: skip
            figures=(("numbers/numbers_ld.png", "numbers-ld.png"), ("numbers/numbers_helix.png", "numbers-helix.png")),
        ),
        Source(
            name="circuits",
            commands=tuple(
                command.format(op=op)
                for op in ("addition", "subtraction")
                for command in (
                    "arithmech identify --operations {op} --max-prompts 64 --fraction-threshold 0.1 "
                    "--out {{runs}}/identify-{op}",
                    "arithmech circuit --method eap-ig --compare-methods eap,path-patching,random "
                    "--identify {{runs}}/identify-{op} --operations {op} --n-prompts 32 --test-prompts 32 --evaluate "
                    "--oracle 50 --out {{runs}}/{op}",
                    "arithmech circuit --method eap --operations {op} --n-prompts 32 --oracle 50 "
                    "--out {{runs}}/{op}-eap-oracle",
                )
            ),
            quick=tuple(
                command.format(op=op)
                for op in ("addition", "subtraction")
                for command in (
                    "arithmech identify --model {{model}} --operations {op} --max-prompts 4 --n-per-template 2 "
                    "--keep-incorrect --fraction-threshold 0.1 --out {{runs}}/identify-{op}",
                    "arithmech circuit --model {{model}} --method eap-ig --compare-methods eap,path-patching,random "
                    "--identify {{runs}}/identify-{op} --operations {op} --n-prompts 2 --keep-incorrect --evaluate "
                    "--percents 1,10,100 --steps 2 --batch-size 2 --oracle 2 --out {{runs}}/{op}",
                    "arithmech circuit --model {{model}} --method eap --operations {op} --n-prompts 2 --keep-incorrect "
                    "--batch-size 2 --oracle 2 --out {{runs}}/{op}-eap-oracle",
                )
            ),
            kept=tuple(
                kept
                for op in ("addition", "subtraction")
                for kept in (
                    Kept("circuits", op, op, ("cpr_cmd.csv", "faithfulness.csv", "oracle.csv")),
                    Kept("circuits", f"{op}-eap-oracle", f"{op}-eap-oracle", ("oracle.csv",)),
                )
            ),
        ),
        Source(
            name="sft-table",
            commands=(
                "arithmech identify --operations addition --max-prompts 64 --fraction-threshold 0.1 "
                "--out {runs}/identify",
                "python experiments/sft_table.py --from {runs}/identify --out {runs}/sft-table --ks 8,32 "
                "--train-samples 64 --eval-limit 6 --n-shot 4 --max-new-tokens 64 --general-limit 20",
            ),
            quick=(
                "arithmech identify --model {model} --operations addition --max-prompts 4 --n-per-template 2 "
                "--keep-incorrect --fraction-threshold 0.1 --out {runs}/identify",
                "python experiments/sft_table.py --model {model} --from {runs}/identify --out {runs}/sft-table "
                "--ks 2 --train-samples 4 --batch-size 2 --micro-batch-size 2 --eval-limit 1 --n-shot 0 "
                "--max-new-tokens 4 --general-limit 2 --data arithmetic",
            ),
            kept=(
                Kept("sft-table", "identify", "identify", ("key_components.json",)),
                Kept("sft-table", "table", "sft-table", ("table.csv",), metadata=False),
            ),
        ),
        Source(
            name="arithmetic-sft",
            commands=("python experiments/arithmetic_sft.py --out {runs}/arithmetic-sft",),
            quick=(
                "python experiments/arithmetic_sft.py --out {runs}/arithmetic-sft --size smoke --model {model} "
                "--keep-incorrect --seeds 2 --sweep-seeds 1 --lrs-precise 1e-3 --lrs-full 1e-4 --lrs-lora 1e-3 "
                "--eval-limit 8 --general-limit 1",
            ),
            kept=(
                Kept("arithmetic-sft", "identify", "arithmetic-sft/identify", ("key_components.json",)),
                Kept("arithmetic-sft", "table", "arithmetic-sft",
                     ("table.csv", "comparisons.csv", "sweep.csv", "settings.json"), metadata=False),
            ),  # fmt: skip
            figures=(("arithmetic-sft/arithmetic_sft.png", "arithmetic-sft.png"),),
        ),
    )
}
"""Every source by name."""


def studies() -> list[str]:
    """The results/ folders, in the order of docs/results.md."""
    seen: dict[str, None] = {}
    for source in SOURCES.values():
        for kept in source.kept:
            seen.setdefault(kept.study)
    return list(seen)
