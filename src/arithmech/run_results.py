"""A finished run folder as typed Python objects whose tables are pandas DataFrames, for notebooks.

    >>> import arithmech as am
    >>> run = am.open_run("runs/demo")          # the --out folder of `arithmech run` (or of `arithmech identify`)
    >>> run.status                              # {"identify": "done", "knockout": "done", "fourier": "not run", ...}
    >>> run.identify.effects                    # effects.csv: one row per head and MLP
    >>> run.knockout.curve                      # knockout_summary.csv: accuracy per k, effect-rank vs random

Each stage's object reads its CSV files on first access and nothing else: no model loads and torch is never
imported (pandas is, on the first table). The values are those of the files, so a table equals its CSV read by
any other tool. A stage that was not run, or did not finish, is refused with one sentence when it is asked for;
one made from an earlier identify run than the one beside it (stale) is read with a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from arithmech import arguments
from arithmech.errors import ConfigError
from arithmech.report.run_folder import DONE, STALE, StageFolder
from arithmech.report.run_folder import open_run as open_folder

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

_INTEGER_COLUMNS = ("layer", "head", "k", "seed", "rank", "neuron")
"""Columns of whole numbers that may have empty cells (an MLP has no head): read as nullable integers, not as
floats, when every value is whole."""


class Table:
    """A CSV file of a stage folder, read as a DataFrame on first access (an attribute of a StageResults)."""

    def __init__(self, file: str) -> None:
        self.file = file

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, stage: StageResults | None, owner: type) -> pd.DataFrame:
        if stage is None:
            return self  # type: ignore[return-value]  # the class attribute itself, for documentation
        return stage.table(self.file)


class StageResults:
    """One finished stage folder: its metadata, and its tables (the Table attributes of each subclass)."""

    def __init__(self, folder: StageFolder) -> None:
        self.name = folder.name
        self.path: Path = folder.folder
        self.status = folder.status
        self._folder = folder
        self._tables: dict[str, pd.DataFrame] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {str(self.path)!r} ({self.status}): {', '.join(self.tables())}>"

    @property
    def metadata(self) -> dict[str, Any]:
        """metadata.json: the stage's settings, model, counts and provenance."""
        return self._folder.metadata

    def tables(self) -> list[str]:
        """The names of this stage's tables whose files exist."""
        return [name for name, t in _tables_of(type(self)).items() if (self.path / t.file).is_file()]

    def table(self, file: str) -> pd.DataFrame:
        """The CSV file `file` of this folder as a DataFrame (cached); ConfigError when the stage wrote none."""
        if file not in self._tables:
            path = self.path / file
            if not path.is_file():
                raise ConfigError(f"{str(path)!r} does not exist: this {self.name} run wrote no {file}")
            import pandas as pd

            frame = pd.read_csv(path)
            for column in _INTEGER_COLUMNS:
                values = frame[column] if column in frame else None
                if values is not None and values.dtype.kind == "f" and (values.dropna() % 1 == 0).all():
                    frame[column] = values.astype("Int64")
            self._tables[file] = frame
        return self._tables[file]


def _tables_of(cls: type) -> dict[str, Table]:
    return {name: value for klass in reversed(cls.__mro__) for name, value in vars(klass).items()
            if isinstance(value, Table)}  # fmt: skip


class IdentifyResults(StageResults):
    """identify: the effect of every head and MLP on the answer, and the key components."""

    effects = Table("effects.csv")
    """One row per head and MLP: component, layer, head (empty for an MLP), kind, effect (relative change of
    the answer's logit difference), effect_std, fraction_of_total."""
    attribution_effects = Table("attribution_effects.csv")
    """The same columns from attribution patching (method attribution or both)."""
    template_accuracy = Table("template_accuracy.csv")
    """Per template: pairs, kept, correct, accuracy of the model on the reference prompts."""
    effects_by_place = Table("effects_by_place.csv")
    """Effects per answer place: units, tens, ... (answer_digits runs)."""
    place_overlap = Table("place_overlap.csv")
    """Spearman and top-k overlap of the effects between two answer places (answer_digits runs)."""

    @property
    def key_components(self) -> dict[str, Any]:
        """key_components.json: the rule, the whole-prompt effect, and the key and ranked components."""
        import json

        return json.loads((self.path / "key_components.json").read_text())


class KnockoutResults(StageResults):
    """knockout: accuracy with the top-k components by effect knocked out, against k random ones."""

    curve = Table("knockout_summary.csv")
    """Per prompt_set (held_out first, then in_sample; unranked for named components without a run) and k:
    effect_accuracy, random_accuracy_mean/std, effect_prob, random_prob_mean/std."""
    rows = Table("knockout.csv")
    """Every configuration scored: prompt_set, k, ranking (none, effect or random), seed, accuracy, mean_prob,
    components."""
    by_place = Table("knockout_by_place.csv")
    """Per answer place, units, tens, ..., and carry group (answer_digits runs)."""
    place_summary = Table("knockout_place_summary.csv")
    """Per k and answer place: effect-ranked against random (answer_digits runs)."""


class TransferResults(StageResults):
    """transfer: the components of one prompt set knocked out on other sets."""

    rows = Table("transfer.csv")
    """Per source and target set: accuracy and answer probability, intact, effect-ranked and random."""


class AttentionResults(StageResults):
    """attention: where each key head looks from the last token."""

    roles = Table("attention_roles.csv")
    """Per head: the attention mass on operand A, operand B, the operator, the prefix and the rest, and its label."""
    by_place = Table("attention_by_place.csv")
    """Per head and answer place, units, tens, ... (answer_digits runs)."""


class MlpResults(StageResults):
    """mlp: the MLP logit lens."""

    cosines = Table("mlp_cosines.csv")
    """Per layer: cosines of the MLP input and update with the unembeddings of A, B and the answer C."""
    update_ranks = Table("mlp_update_ranks.csv")
    """Per layer: the rank of the answer among the numbers in the MLP update's readout."""


class FourierResults(StageResults):
    """fourier: frequencies over the number tokens and accuracy with frequencies filtered out."""

    spectrum = Table("fourier_spectrum.csv")
    """Per layer and kind (attention, MLP) and frequency: the magnitude."""
    filters = Table("fourier_filters.csv")
    """Per filter: accuracy and answer probability."""


class MediationResults(StageResults):
    """mediation: causal mediation per layer for arithmetic, retrieval and facts."""

    by_class = Table("mediation_by_class.csv")
    """Per task, layer, component and statistic: the indirect effect."""
    total = Table("mediation_total.csv")
    """Per task: counts, mean and median total effect, number accuracy."""
    neuron_top = Table("neuron_top.csv")
    """Per task: the top neurons by mean indirect effect."""
    neuron_overlap = Table("neuron_overlap.csv")
    """Per pair of tasks: the overlap of their top neurons."""


class AgreementResults(StageResults):
    """agreement: how far the ranking methods agree."""

    agreement = Table("agreement.csv")
    """Per level and pair of methods: Spearman and top-k overlaps."""
    importance = Table("importance.csv")
    """Per component: its importance under each method."""


class NeuronsResults(StageResults):
    """neurons: head importance per operation, comparative neuron analysis, pruning."""

    head_importance = Table("head_importance.csv")
    attention_li = Table("attention_li.csv")
    cna_neurons = Table("cna_neurons.csv")
    pruning = Table("pruning.csv")
    lora_coefficients = Table("lora_coefficients.csv")


class HeuristicsResults(StageResults):
    """heuristics: heuristic neurons and their patterns."""

    grid = Table("grid.csv")
    neurons = Table("neurons.csv")
    layers = Table("layers.csv")
    ablation = Table("ablation.csv")
    patterns = Table("patterns.csv")


class NumbersResults(StageResults):
    """numbers: how the operands are represented, each reading judged by patching (the helix and its rivals)."""

    ld = Table("numbers_ld.csv")


class CircuitResults(StageResults):
    """circuit: faithfulness of the top-k % edge circuits and the exact scores of sampled edges."""

    faithfulness = Table("faithfulness.csv")
    """Per method, ranking and size: edges kept, f and m."""
    cpr_cmd = Table("cpr_cmd.csv")
    """Per method: CPR (area under f, signed ranking) and CMD (area under |1 - f|, absolute ranking)."""
    oracle = Table("oracle.csv")
    """Per sampled edge (with `oracle`): the method's score beside the exact one."""


class FinetuneResults(StageResults):
    """finetune: the training log of the tuned model."""

    train_log = Table("train_log.csv")


class EvaluateResults(StageResults):
    """evaluate: benchmark scores of the base model and, after finetune, of the tuned one."""

    results = Table("base/results.csv")
    """Per benchmark: the base model's score."""
    tuned_results = Table("tuned/results.csv")
    """Per benchmark: the tuned model's score (after a finetune stage)."""


S = TypeVar("S", bound=StageResults)


class _Stage(Generic[S]):
    """A Run attribute: the stage's results, refused with one sentence when the stage has none."""

    def __init__(self, cls: type[S]) -> None:
        self.cls = cls

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, run: Run | None, owner: type) -> S:
        if run is None:
            return self  # type: ignore[return-value]
        folder = run.folders[self.name]
        if folder.status not in (DONE, STALE):
            raise ConfigError(f"stage {self.name!r} {folder.status} in {str(run.path)!r}, so it has no results")
        if folder.status == STALE:
            logger.warning("%s in %s is stale: %s", self.name, run.path, folder.stale)
        return self.cls(folder)


class Run:
    """A run folder: each stage's results as an attribute (`run.identify`, `run.knockout`, ...)."""

    identify = _Stage(IdentifyResults)
    knockout = _Stage(KnockoutResults)
    transfer = _Stage(TransferResults)
    attention = _Stage(AttentionResults)
    mlp = _Stage(MlpResults)
    fourier = _Stage(FourierResults)
    mediation = _Stage(MediationResults)
    agreement = _Stage(AgreementResults)
    neurons = _Stage(NeuronsResults)
    heuristics = _Stage(HeuristicsResults)
    numbers = _Stage(NumbersResults)
    circuit = _Stage(CircuitResults)
    finetune = _Stage(FinetuneResults)
    evaluate = _Stage(EvaluateResults)

    def __init__(self, path: Path, folders: dict[str, StageFolder]) -> None:
        self.path = path
        self.folders = folders

    @property
    def status(self) -> dict[str, str]:
        """Each stage's state: done, not run, did not finish, or stale."""
        return {name: folder.status for name, folder in self.folders.items()}

    def __repr__(self) -> str:
        done = [name for name, status in self.status.items() if status in (DONE, STALE)]
        return f"<Run {str(self.path)!r}: {', '.join(done)}>"


def open_run(run_dir: str | Path) -> Run:
    """Open a run folder (of `arithmech run`, `am.run`, or stage by stage) for reading; nothing is computed."""
    folder = open_folder(arguments.path(run_dir, "open_run's run_dir"))
    return Run(folder.path, folder.stages)
