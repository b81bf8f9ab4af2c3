"""The circuit stage's settings (stages/circuit.py runs them), importable without torch.

The CLI builds `arithmech circuit`'s config from its options and validates it before a model loads: an unknown
method, a circuit size outside (0, 100] %, or a --from that holds no readable circuit file fails at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from arithmech.errors import ConfigError

CIRCUIT_METHODS = ("eap", "eap-ig", "path-patching", "random")
"""Edge rankings: EAP, EAP-IG on the inputs, identify's node ranking (path patching, weakest link), and a seeded
random ranking (the baseline)."""
IDENTIFY_METHOD = "path-patching"
"""The ranking read from an identify run."""
CIRCUIT_ABLATIONS = ("counterfactual", "mean")
MIB_OPERATION_NAMES = ("addition", "subtraction")
MIB_PERCENTS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
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
        method = config.get("method", "eap-ig") if config.get("from_circuit") is None else None
        return IDENTIFY_METHOD in (method, *(config.get("compare_methods") or ()))

    method: str = field(default="eap-ig", metadata={"help": "edge ranking: eap, eap-ig, path-patching or random"})
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
    n_prompts: int = field(default=32, metadata={"help": "prompt pairs kept (the model predicts the scored token)"})
    steps: int = field(default=5, metadata={"help": "EAP-IG interpolation steps (MIB: 5)"})
    ablation: str = field(default="counterfactual", metadata={"help": "edges outside: counterfactual or mean"})
    evaluate: bool = field(default=False, metadata={"help": "run the faithfulness sweep (CPR, CMD)"})
    percents: tuple[float, ...] = field(
        default=MIB_PERCENTS, metadata={"help": "circuit sizes of the sweep, % of edges"}
    )
    circuit_percent: float = field(default=5.0, metadata={"help": "size marked in_graph in edges.json, % of edges"})
    draw_percent: float | None = field(
        default=None,
        metadata={"help": "size of the drawn circuit (circuit.svg), % of edges; default the smallest swept circuit "
                          f"with f >= 0.8, else the top {DRAWN_DEFAULT} edges; at most {DRAWN_MAX} edges are drawn"},
    )  # fmt: skip
    from_circuit: str | None = field(
        default=None, metadata={"help": "circuit folder (or its edges.json) whose scores and prompts are reused"}
    )
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
    mib_split: str = field(default="train", metadata={"help": "split of --mib-dataset (MIB finds circuits on train)"})
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
        for method in (self.method, *self.compare_methods):
            if method not in CIRCUIT_METHODS:
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
        if not self.percents or list(self.percents) != sorted(set(self.percents)):
            raise ConfigError("percents must be increasing, without repeats, e.g. 0.1,1,10,100")
        if self.mib_dataset is not None and self.from_circuit is not None:
            raise ConfigError("--from reuses its folder's prompts: give --mib-dataset or --from, not both")
        if self.oracle < 0:
            raise ConfigError(f"oracle must be 0 (off) or a number of edges (got {self.oracle})")
        for name in ("n_prompts", "min_prompts", "steps", "batch_size", "max_operand"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)})")

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
            from arithmech.data.mib_dataset import read_mib_rows  # reads the rows now: bad data fails before the model

            read_mib_rows(self.mib_dataset, self.mib_split)
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
