"""The circuit stage's settings (stages/circuit.py runs them), importable without torch.

The CLI builds `arithmech circuit`'s config from its options and validates it before a model loads: an unknown
method, a circuit size outside (0, 100] %, a combination that makes no sense (--circuit-file with --from), or a
--from that holds no readable circuit file (or, for a held-out evaluation, no test pairs) fails at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from arithmech.data.mib_facts import distinct_prompts
from arithmech.errors import ConfigError

CIRCUIT_METHODS = ("eap", "eap-ig", "path-patching", "random")
"""Edge rankings: EAP, EAP-IG on the inputs, identify's node ranking (path patching, weakest link), and a seeded
random ranking (the baseline)."""
DEFAULT_METHOD = "eap-ig"
"""The ranking of edges scored anew when none is given (MIB's baseline)."""
SCORING_SETTINGS = ("n_prompts", "test_prompts", "operations", "max_operand", "steps", "keep_incorrect", "min_prompts")
"""Settings that make the find and test pairs or score the edges. `from_circuit` reuses a folder's pairs and scores,
so it uses none of them: one given (other than its default) is refused, and metadata.json records the folder's."""
IDENTIFY_METHOD = "path-patching"
"""The ranking read from an identify run."""
CIRCUIT_ABLATIONS = ("counterfactual", "mean")
CIRCUIT_RANKINGS = ("signed", "absolute")
"""How edges.json's in_graph circuit is chosen: top edges by score (CPR's ranking) or by |score| (CMD's)."""
MIB_OPERATION_NAMES = ("addition", "subtraction")
MIB_PERCENTS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
MIB_FIND_SPLIT = "train"
"""The split MIB finds circuits on (MIB-circuit-track run_attribution.py, --split default)."""
MIB_EVAL_SPLIT = "validation"
"""The split MIB evaluates circuits on (run_evaluation.py, --split default; its README: "By default, this will
evaluate on the validation set")."""
TEST_PROMPTS_FILE = "test_prompts.jsonl"
"""The held-out pairs a circuit folder is evaluated on, beside prompts.jsonl (the pairs its edges were scored on)."""
DRAWN_DEFAULT = 200
"""Edges drawn when no size is given and no swept circuit reaches f >= 0.8."""
DRAWN_MAX = 500
"""The most edges a drawing holds: beyond it the lines merge into a blot."""


@dataclass(frozen=True)
class CircuitConfig:
    """Settings of the circuit stage."""

    STAGE: ClassVar[str] = "circuit"
    """The "stage" of its runs' metadata.json."""

    @staticmethod
    def reads_identify_run(config: dict[str, Any]) -> bool:
        """Whether a run with this "config" read an identify run: only method path-patching (--identify)."""
        return config.get("identify_run") is not None

    @staticmethod
    def ranks_by_identify(config: Mapping[str, Any]) -> bool:
        """Whether these settings rank edges by an identify run's node effects: path-patching as `method` (of
        edges scored anew, not read back with `from_circuit`) or among `compare_methods`. `arithmech run` then
        fills `identify_run` with its own identify folder."""
        read = config.get("from_circuit") is not None or config.get("circuit_file") is not None
        method = None if read else config.get("method") or DEFAULT_METHOD
        return IDENTIFY_METHOD in (method, *(config.get("compare_methods") or ()))

    method: str | None = field(
        default=None,
        metadata={"help": f"edge ranking: eap, eap-ig, path-patching or random (default {DEFAULT_METHOD}); not with "
                          "from_circuit or circuit_file, whose ranking is the folder's or the file's"},
    )  # fmt: skip
    compare_methods: tuple[str, ...] = field(
        default=(),
        metadata={"help": "further rankings scored on the same prompts and swept beside method's (with evaluate), "
                          "e.g. path-patching,random"},
    )  # fmt: skip
    identify_run: str | None = field(
        default=None, metadata={"help": "identify run whose node ranking method path-patching turns into edges"}
    )
    operations: tuple[str, ...] = field(
        default=("addition",), metadata={"help": "MIB arithmetic tasks whose prompts are pooled: addition, subtraction"}
    )
    n_prompts: int = field(
        default=32, metadata={"help": "prompt pairs the edges are scored on (the find pairs; the model answers both)"}
    )
    test_prompts: int | None = field(
        default=None,
        metadata={"help": "held-out pairs the circuits are evaluated on (the test pairs; default n_prompts), disjoint "
                          "from the find pairs"},
    )  # fmt: skip
    in_sample: bool = field(
        default=False,
        metadata={"help": "evaluate on the pairs the edges were scored on (no held-out split; every table says "
                          "in-sample)"},
    )  # fmt: skip
    random_seeds: int = field(
        default=3, metadata={"help": "seeds the random ranking is drawn with; its CPR and CMD are the mean and spread"}
    )
    steps: int = field(default=5, metadata={"help": "EAP-IG interpolation steps (MIB: 5)"})
    ablation: str = field(default="counterfactual", metadata={"help": "edges outside: counterfactual or mean"})
    evaluate: bool = field(default=False, metadata={"help": "run the faithfulness sweep (CPR, CMD)"})
    percents: tuple[float, ...] = field(
        default=MIB_PERCENTS, metadata={"help": "circuit sizes of the sweep, % of edges"}
    )
    circuit_percent: float = field(
        default=5.0, metadata={"help": "size of the circuit marked in_graph in edges.json, % of edges (ranked by "
                                       "circuit_ranking)"}
    )  # fmt: skip
    circuit_ranking: str = field(
        default="signed",
        metadata={"help": "how the in_graph circuit is ranked: signed (the top edges by score, CPR's ranking: an "
                          "edge with a large negative score is left out) or absolute (by |score|, CMD's)"},
    )  # fmt: skip
    draw_percent: float | None = field(
        default=None,
        metadata={"help": "size of the drawn circuit (circuit.svg), % of edges; default the smallest swept circuit "
                          f"with f >= 0.8, else the top {DRAWN_DEFAULT} edges; at most {DRAWN_MAX} edges are drawn"},
    )  # fmt: skip
    from_circuit: str | None = field(
        default=None,
        metadata={"help": "circuit folder (or its edges.json) whose scores and find and test pairs are reused"},
    )
    circuit_file: str | None = field(
        default=None,
        metadata={"help": "a circuit file in MIB's format (made by any tool) to evaluate on the test pairs: its "
                          "in_graph circuit, and the sweep by its scores where it scores every edge"},
    )  # fmt: skip
    oracle: int = field(
        default=0, metadata={"help": "exact scores of the top n edges and n random ones, against the method's (0: off)"}
    )
    compare: tuple[str, ...] = field(
        default=(), metadata={"help": "other circuit folders (with faithfulness.csv) drawn in the same figure"}
    )
    keep_incorrect: bool = field(
        default=False,
        metadata={"help": "keep prompts whose scored token the model does not predict (tests, weak models)"},
    )
    mib_dataset: str | None = field(
        default=None,
        metadata={
            "help": "MIB's own data instead of the built-in prompts: a Hugging Face name "
            "(mib-bench/arithmetic_addition) or a local copy (save_to_disk folder, .json/.jsonl/.parquet/.csv)"
        },
    )
    mib_split: str = field(
        default=MIB_FIND_SPLIT, metadata={"help": "split of --mib-dataset the edges are scored on (MIB: train)"}
    )
    mib_eval_split: str = field(
        default=MIB_EVAL_SPLIT,
        metadata={"help": "split the circuits are evaluated on (MIB evaluates on validation); its rows that share a "
                          "prompt with the find split are dropped"},
    )  # fmt: skip
    mib_eval_dataset: str | None = field(
        default=None,
        metadata={"help": "where the evaluation rows are, when --mib-dataset is one file without splits (default: "
                          "--mib-dataset itself)"},
    )  # fmt: skip
    min_prompts: int = field(
        default=4,
        metadata={"help": "fewest pairs that may survive the answer filter (at most n_prompts); fewer is refused"},
    )
    max_operand: int = field(default=99, metadata={"help": "largest operand of the prompts"})
    batch_size: int = field(default=8, metadata={"help": "prompts per patched forward pass"})
    seed: int = field(default=0, metadata={"help": "seed of the prompts and of the random ranking"})

    def __post_init__(self) -> None:
        for name in ("operations", "percents", "compare", "compare_methods"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        self._resolve_method()
        for method in (self.method, *self.compare_methods):
            if method is not None and method not in CIRCUIT_METHODS:
                raise ConfigError(f"method {method!r} is not one of {', '.join(CIRCUIT_METHODS)}")
        if self.method in self.compare_methods or len(set(self.compare_methods)) < len(self.compare_methods):
            raise ConfigError("compare_methods repeats a method; name each ranking once, apart from method")
        if self.compare_methods and not self.evaluate:
            raise ConfigError("compare_methods are compared by the faithfulness sweep; give evaluate (--evaluate) too")
        if self.ranks_by_identify(asdict(self)) != (self.identify_run is not None):
            raise ConfigError(
                "method path-patching ranks edges by an identify run's node effects: give --method path-patching "
                "(or name it in compare_methods) together with --identify RUN_DIR (and --identify only with it)"
            )
        if self.circuit_ranking not in CIRCUIT_RANKINGS:
            raise ConfigError(f"circuit_ranking {self.circuit_ranking!r} is not one of {', '.join(CIRCUIT_RANKINGS)}")
        if self.ablation not in CIRCUIT_ABLATIONS:
            raise ConfigError(f"ablation {self.ablation!r} is not one of {', '.join(CIRCUIT_ABLATIONS)}")
        unknown = [op for op in self.operations if op not in MIB_OPERATION_NAMES]
        if unknown or not self.operations:
            raise ConfigError(
                f"operations {', '.join(unknown) or '(none)'} have no MIB prompts; choose from "
                f"{', '.join(MIB_OPERATION_NAMES)}"
            )
        drawn = () if self.draw_percent is None else (self.draw_percent,)
        for k in (*self.percents, self.circuit_percent, *drawn):
            if not 0 < k <= 100:
                raise ConfigError(f"a circuit size of {k} % is outside (0, 100]; give a percentage of edges kept")
        if not self.percents:
            raise ConfigError("percents is empty; give the circuit sizes of the sweep in % of edges, e.g. "
                              "0.1,1,10,100 (the default is MIB's ten sizes)")  # fmt: skip
        if list(self.percents) != sorted(set(self.percents)):
            raise ConfigError("percents must be increasing, without repeats, e.g. 0.1,1,10,100")
        if self.mib_dataset is not None and self.from_circuit is not None:
            raise ConfigError("--from reuses its folder's prompts: give --mib-dataset or --from, not both")
        self._check_split()
        self._check_circuit_file()
        if self.oracle < 0:
            raise ConfigError(f"oracle must be 0 (off) or a number of edges (got {self.oracle})")
        for name in ("n_prompts", "min_prompts", "steps", "batch_size", "max_operand", "random_seeds", "test_prompts"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")
        self._check_supply()

    def _check_supply(self) -> None:
        """Refuse more built-in pairs than the generator can give: a part of the prompts with operands
        0..max_operand holds so many different prompts, and a pair takes two, even if the model answered all."""
        if self.mib_dataset is not None or self.from_circuit is not None:
            return
        test_option = "--n-prompts" if self.test_prompts is None else "--test-prompts"
        wanted = [] if self.circuit_file is not None else [
            ("(in-sample: every fact)" if self.in_sample else "of the find part", None if self.in_sample else "find",
             self.n_prompts, "--n-prompts")]  # fmt: skip
        if not self.in_sample:
            wanted.append(("of the test part", "test", self.n_test, test_option))
        for name, part, n, option in wanted:
            quota = -(-n // len(self.operations))
            for operation in self.operations:
                held = distinct_prompts(operation, self.max_operand, self.seed, part)
                if quota > held // 2:
                    most = held // 2 * len(self.operations)
                    raise ConfigError(
                        f"{option} {n} asks {quota} {operation} pairs {name}, but with operands "
                        f"0..{self.max_operand} it holds {held:,} different {operation} prompts, so at most "
                        f"{held // 2:,} pairs even if the model answered every prompt (SmolLM2-135M answers about 1 "
                        f"in 10, which leaves about {held // 20:,}); give {option} {most} or fewer, a larger "
                        "--max-operand, or pairs of your own with --mib-dataset"
                    )  # fmt: skip

    def _resolve_method(self) -> None:
        """The method: the default for edges scored anew; none for edges read back, which keep their ranking, and
        no setting that only scoring uses (an option that would be dropped is refused)."""
        source = "--from" if self.from_circuit is not None else "--circuit-file" if self.circuit_file else None
        if source is None:
            if self.method is None:
                object.__setattr__(self, "method", DEFAULT_METHOD)
            return
        unused = ["--method"] if self.method is not None else []
        if source == "--from":
            defaults = {f.name: f.default for f in fields(self)}
            given = [name for name in SCORING_SETTINGS if getattr(self, name) != defaults[name]]
            unused += ["--" + name.replace("_", "-") for name in given]
        if unused:
            what = "edge scores and find and test pairs of its folder" if source == "--from" else "circuit of the file"
            raise ConfigError(
                f"{source} evaluates the {what}, so {', '.join(unused)} would not be used; leave "
                f"{'it' if len(unused) == 1 else 'them'} out, or score edges anew without {source} (into another --out)"
            )  # fmt: skip

    def _check_split(self) -> None:
        """The held-out split's settings: each only where it applies."""
        if self.in_sample and (self.test_prompts is not None or self.mib_eval_dataset is not None):
            raise ConfigError("--in-sample evaluates on the pairs the edges were scored on: leave out --test-prompts "
                              "and --mib-eval-dataset, or drop --in-sample")  # fmt: skip
        if self.mib_eval_dataset is not None and self.mib_dataset is None:
            raise ConfigError("--mib-eval-dataset holds MIB's evaluation rows: give --mib-dataset (the find rows) too")
        same = self.mib_eval_dataset is None and self.mib_eval_split == self.mib_split
        if self.mib_dataset is not None and not self.in_sample and same:
            raise ConfigError(
                f"--mib-split and --mib-eval-split are both {self.mib_split!r}, so the circuits would be evaluated on "
                f"the rows they were found on; give another --mib-eval-split (MIB: {MIB_EVAL_SPLIT}) or --in-sample"
            )

    def _check_circuit_file(self) -> None:
        """--circuit-file evaluates a circuit made elsewhere: no scoring here, so no scoring settings."""
        if self.circuit_file is None:
            return
        settings = (
            ("--from", self.from_circuit), ("--compare-methods", self.compare_methods), ("--oracle", self.oracle),
            ("--identify", self.identify_run), ("--in-sample", self.in_sample),
        )  # fmt: skip
        clash = [flag for flag, value in settings if value]
        if clash:
            raise ConfigError(
                f"--circuit-file evaluates a circuit another tool found, on the test pairs, so {clash[0]} (which "
                "scores edges here) does not apply; score methods in their own runs and draw them with --compare"
            )  # fmt: skip

    @property
    def n_test(self) -> int:
        """Held-out pairs wanted: test_prompts, else as many as find pairs."""
        return self.n_prompts if self.test_prompts is None else self.test_prompts

    def edges_file(self) -> Path | None:
        """The edges.json of `from_circuit` (a folder or the file itself)."""
        if self.from_circuit is None:
            return None
        path = Path(self.from_circuit).expanduser()
        return path / "edges.json" if path.is_dir() else path

    def check_files(self) -> None:
        """Read --from's circuit file now (preflight), so a missing or malformed one fails before the model loads;
        check that each --compare folder holds a sweep.
        --identify is checked as every identify run setting is (`preflight.stage_paths`)."""
        for folder in self.compare:
            if not (Path(folder).expanduser() / "faithfulness.csv").is_file():
                raise ConfigError(
                    f"--compare {folder!r} holds no faithfulness.csv; give a folder of `arithmech circuit --evaluate`"
                )
        if self.mib_dataset is not None:
            self._check_mib_rows()
        if self.circuit_file is not None:
            from arithmech.circuits.circuit_file import read_edges  # torch: only when a file is given

            read_edges(self.circuit_file)
        path = self.edges_file()
        if path is None:
            return
        if not path.is_file():
            raise ConfigError(f"--from {self.from_circuit!r} holds no edges.json; give a folder of `arithmech circuit`")
        from arithmech.circuits.circuit_file import read_edges  # torch: only when a file is given

        read_edges(path)
        if path.parent.joinpath("prompts.jsonl").is_file() is False:
            raise ConfigError(
                f"--from {self.from_circuit!r} has an edges.json but no prompts.jsonl beside it; give the whole folder "
                "`arithmech circuit` wrote"
            )
        if self.evaluate and not self.in_sample and not path.parent.joinpath(TEST_PROMPTS_FILE).is_file():
            raise ConfigError(
                f"--from {self.from_circuit!r} holds no held-out pairs ({TEST_PROMPTS_FILE}: it was scored before "
                "circuits were evaluated on held-out pairs, or with --in-sample); score it anew, or pass --in-sample "
                "to evaluate on the pairs its edges were scored on"
            )

    def _check_mib_rows(self) -> None:
        """Read --mib-dataset's rows now (bad data fails before the model loads), and the evaluation rows' source."""
        from arithmech.data.mib_dataset import holds_splits, read_mib_rows

        assert self.mib_dataset is not None
        read_mib_rows(self.mib_dataset, self.mib_split)
        if self.in_sample:
            return
        if self.mib_eval_dataset is None and not holds_splits(self.mib_dataset):
            raise ConfigError(
                f"--mib-dataset {self.mib_dataset!r} is one table without splits, so it has no {self.mib_eval_split!r} "
                "split to evaluate on; give the evaluation rows with --mib-eval-dataset (e.g. MIB's validation split "
                "saved as .jsonl), a save_to_disk folder of all splits, or --in-sample"
            )
        read_mib_rows(self.mib_eval_dataset or self.mib_dataset, self.mib_eval_split)
