"""The whole study in one run folder: identify -> knockout -> transfer -> analysis -> mediation -> ... -> evaluate.

A run is described by one YAML file (or the same keys given as flags), for example:

    model: {model: null, device: cpu, dtype: float32}   # ModelConfig fields; null = built-in default model
                                                        # (model: <id> is short for model: {model: <id>});
                                                        # max_memory: 24GB fits every stage's sizes to a budget
    out: runs/demo
    seed: 0                                             # given to every stage that has a seed
    stages: [identify, knockout, attention, mlp]        # default: every stage in STAGES but finetune, fourier,
                                                        # heuristics, circuit
    identify: {operations: [addition], fraction_threshold: 0.1}
    knockout: {max_k: 16, n_random: 3}

A stage may also be named after the command that runs it alone: `mediate` for mediation, `analyze attention`,
`analyze mlp`, `analyze fourier`, `analyze agreement` and `analyze heuristics` (or with - or _ for the space)
for attention, mlp, fourier, agreement and heuristics; in
`stages`, as a settings key and in --set, e.g. --set mediate.n_pairs=8. The folder and the record always use
the stage's own name (STAGE_ALIASES).

Each stage writes into <out>/<stage>/ and its own metadata.json last. After a stage finishes, its fingerprint
(a hash of its settings, the model settings, the fingerprints of the stages it reads and the arithmech
version) is recorded in <out>/pipeline.json; a later run skips a stage whose fingerprint is unchanged and whose
folder is complete, reruns it otherwise, and so resumes an interrupted run where it stopped (stages that scan
for long also resume inside themselves from <stage>/.partial). A stage about to run again loses its record
first, so a run stopped at any point (Ctrl-C, a full disk) never keeps a folder that holds a mix of old and
new files. A stage whose code is not in this version is reported as unavailable, never faked.

What identify leaves is read by content: its upstream fingerprint for the later stages is the fingerprint of
its files (`lineage.identify_fingerprint`, also recorded in pipeline.json), so an identify folder replaced by
another command (`arithmech identify --out <out>/identify`) is rerun, and so are the stages that read it when
its content changed.

Every value is checked before the model loads: each setting against its field's type (`config_values.py`,
"knockout.max_k takes a whole number (int); got 'abc'"), every path (`preflight.py`), and settings given for
a stage left out of `stages` against the folder a chosen stage will read (identify.operations: [multiplication]
with stages [knockout] and an addition identify/ is refused, not silently ignored). So is the memory: every chosen
stage's sizes are fitted to model.max_memory (or the device's free memory) from the model's shape, and one that
cannot fit stops the run before any stage runs (`plan/budget.py`).

Python API: `load_run_config(path, overrides)` -> RunConfig, `run_pipeline(cfg)` -> {stage: result}.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arithmech import distributed, preflight, run_lock
from arithmech.config_values import apply_overrides, coerce, read_yaml_mapping, suggest, typed_settings
from arithmech.errors import ConfigError
from arithmech.lineage import identify_fingerprint, read_metadata, refuse_answer_digits
from arithmech.runs import atomic_write_json

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: where its code lives and which earlier stages' folders it reads."""

    name: str
    config: str  # "module:ConfigClass"
    run: Callable[[Any, Any, Path, Path, bool], Any]  # (handle, cfg, out_dir, run_dir, quiet) -> result
    needs: tuple[str, ...] = ()
    default_on: bool = True
    sharded: bool = False
    """Runs in every process of a multi-process launch and splits its work over them (scans their prompts,
    finetune each batch); other stages run on rank 0 only while the rest wait."""
    reads: tuple[str, ...] = ()
    """Stages whose results are used when present (part of the fingerprint then), but not required."""


def _call(target: str, *args: Any, **kwargs: Any) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


def _with(cfg: Any, **changes: Any) -> Any:
    return dataclasses.replace(cfg, **changes)


STAGES: tuple[Stage, ...] = (
    Stage("identify", "arithmech.stages.identify_config:IdentifyConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.identify:identify", h, c, o, quiet=q), sharded=True),
    Stage("knockout", "arithmech.stages.knockout_config:KnockoutConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.knockout:knockout", h,
                                      _with(c, from_run=str(r / "identify")), o, quiet=q),
          needs=("identify",), sharded=True),
    Stage("transfer", "arithmech.stages.transfer_config:TransferConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.transfer:transfer", h,
                                      _with(c, sources=(str(r / "identify"),)), o, quiet=q),
          needs=("identify",)),
    Stage("attention", "arithmech.stages.analyze_attention_config:AttentionConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.analyze_attention:analyze_attention", h, c,
                                      r / "identify", o, quiet=q),
          needs=("identify",)),
    Stage("mlp", "arithmech.stages.analyze_mlp_config:AnalyzeMlpConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.analyze_mlp:analyze_mlp", h, c, r / "identify", o, quiet=q),
          needs=("identify",)),
    Stage("fourier", "arithmech.stages.fourier_config:FourierConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.fourier:analyze_fourier", h, c, r / "identify", o, quiet=q),
          needs=("identify",), default_on=False),
    Stage("mediation", "arithmech.stages.mediate_config:MediateConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.mediate:mediate", h, c, o, quiet=q), sharded=True),
    Stage("agreement", "arithmech.stages.agreement_config:AgreementConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.agreement:method_agreement", h,
                                      _with(c, from_run=str(r / "identify")), o, quiet=q),
          needs=("identify",)),
    Stage("neurons", "arithmech.stages.neurons_config:NeuronsConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.neurons:neurons", h, c, o, quiet=q)),
    Stage("heuristics", "arithmech.stages.heuristics_config:HeuristicsConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.heuristics:heuristics", h, c, o, quiet=q), default_on=False),
    Stage("numbers", "arithmech.stages.numbers_config:NumbersConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.numbers:analyze_numbers", h,
                                      _with(c, identify_run=str(r / "identify")) if c.identify_run else c, o,
                                      quiet=q),
          default_on=False),
    Stage("circuit", "arithmech.stages.circuit_config:CircuitConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.circuit:circuit", h,
                                      _with(c, identify_run=str(r / "identify")) if c.identify_run else c, o,
                                      quiet=q),
          default_on=False),
    Stage("finetune", "arithmech.stages.finetune_config:FinetuneConfig",
          lambda h, c, o, r, q: _finetune(h, c, o, r, q), needs=("identify",), default_on=False, sharded=True),
    Stage("evaluate", "arithmech.stages.evaluate_config:EvaluateConfig",
          lambda h, c, o, r, q: _evaluate(h, c, o, r, q), reads=("finetune",)),
)  # fmt: skip
"""Every stage in run order. finetune (the slow one), fourier, heuristics, numbers and circuit (optional analyses)
are off unless named in `stages`. circuit reads identify's folder only with the path-patching ranking, numbers only
to classify the Clock's heads (identify_run set to anything: `needs_of`)."""

PLANNED: tuple[str, ...] = ()
"""Stages a user may name that this version does not have yet."""

STAGE_ALIASES: dict[str, str] = {
    "mediate": "mediation",
    **{f"analyze{sep}{name}": name for name in ("attention", "mlp", "fourier", "agreement", "heuristics", "numbers")
       for sep in (" ", "-", "_")},
}
"""Command names that name a stage: `arithmech mediate` runs the mediation stage, `arithmech analyze mlp` mlp."""


def canonical_stage(name: str) -> str:
    """The stage's own name for a name or command name ('mediate' -> 'mediation'); other names unchanged."""
    return STAGE_ALIASES.get(" ".join(name.split()), name)


def _finetune(handle: Any, cfg: Any, out: Path, run_dir: Path, quiet: bool) -> Any:
    """Train into <run>/finetune on a copy of the model, so later stages still see the base model."""
    import copy

    from arithmech.models.load import ModelHandle

    tuned = copy.deepcopy(handle.model)
    copy_handle = ModelHandle(tuned, handle.tokenizer, type(handle.view)(tuned, handle.view.spec), handle.source)
    from_run = {"from_run": str(run_dir / "identify")}  # its top-k heads, or the model check of named components
    return _call("arithmech.stages.finetune:finetune", copy_handle, _with(cfg, **from_run), out, quiet=quiet)


def _evaluate(handle: Any, cfg: Any, out: Path, run_dir: Path, quiet: bool) -> Any:
    """The base model into <run>/evaluate/base; with a finished finetune stage, also the tuned model into
    <run>/evaluate/tuned (its delta applied to a copy; general-text KL measured against the base model)."""
    import copy

    from arithmech.models.load import ModelHandle

    (out / "metadata.json").unlink(missing_ok=True)  # written last again, once base (and tuned) are done
    results = {"base": _call("arithmech.stages.evaluate:evaluate_stage", handle, cfg, out / "base", quiet=quiet)}
    delta = run_dir / "finetune"
    if (delta / "metadata.json").is_file():  # a finished finetune; an interrupted one may leave delta files
        from arithmech.finetune.delta import apply_delta, delta_record

        tuned = apply_delta(copy.deepcopy(handle.model), delta)
        tuned_handle = ModelHandle(tuned, handle.tokenizer, type(handle.view)(tuned, handle.view.spec), handle.source)
        results["tuned"] = _call("arithmech.stages.evaluate:evaluate_stage", tuned_handle, cfg, out / "tuned",
                                 quiet=quiet, base_handle=handle, delta=delta_record(delta))  # fmt: skip
    from arithmech.runs import atomic_write_json

    atomic_write_json(out / "metadata.json", {"stage": "evaluate", "models": sorted(results), "identify_runs": []})
    return results


_PLACEHOLDER = "<from the pipeline>"
_INJECTED = frozenset({"from_run", "sources", "identify_run"})  # config fields the pipeline fills with upstream folders


@dataclass(frozen=True)
class RunConfig:
    """A whole run: the model, the output folder, which stages, and each stage's settings."""

    out: str = field(default="runs/pipeline", metadata={"help": "run folder; each stage gets a subfolder"})
    model: dict[str, Any] = field(default_factory=dict, metadata={"help": "ModelConfig fields"})
    seed: int = field(default=0, metadata={"help": "seed given to every stage that has one"})
    stages: tuple[str, ...] = field(default=(), metadata={"help": "stages to run; default every default-on stage"})
    settings: dict[str, Any] = field(default_factory=dict, metadata={"help": "stage name -> its config object"})
    given: dict[str, dict[str, Any]] = field(
        default_factory=dict,
        metadata={"help": "settings given for a stage left out of stages whose folder a chosen stage reads: "
                          "checked against the settings that folder was made with"},
    )  # fmt: skip


def stage_by_name(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == canonical_stage(name):
            return stage
    if name in PLANNED:
        raise ConfigError(f"stage {name!r} is not available in this version of arithmech; leave it out of stages")
    raise ConfigError(f"unknown stage {name!r}{suggest(name, [s.name for s in STAGES])}")


def _config_class(stage: Stage) -> type:
    module, name = stage.config.split(":")
    return getattr(importlib.import_module(module), name)


def build_stage_config(stage: Stage, values: Any, seed: int) -> Any:
    """The stage's config object from YAML values, each checked against its field's type; an unknown key is
    named with the closest real one."""
    cls = _config_class(stage)
    values = typed_settings(cls, values, stage.name)
    names = {f.name for f in dataclasses.fields(cls)}
    if "seed" in names:
        values.setdefault("seed", seed)
    for name in {"from_run", "sources"} & names:
        values.setdefault(name, _PLACEHOLDER if name == "from_run" else (_PLACEHOLDER,))
    if hasattr(cls, "ranks_by_identify") and cls.ranks_by_identify(values):  # circuit's path-patching ranking
        values.setdefault("identify_run", _PLACEHOLDER)
    return cls(**values)


def needs_of(stage: Stage, cfg: Any) -> tuple[str, ...]:
    """The stages whose folders `stage` reads with the settings `cfg`: its fixed needs, and identify when its
    config declares that it reads an identify run (circuit with the path-patching ranking)."""
    reads = type(cfg).reads_identify_run(dataclasses.asdict(cfg)) and "identify" not in stage.needs
    return (*stage.needs, "identify") if reads else stage.needs


def load_run_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run description (optional) and apply `overrides` ("identify.max_prompts" -> 32, "out" -> ...)."""
    data = _canonical_keys(read_yaml_mapping(path) if path is not None else {})
    data = apply_overrides(data, {_canonical_key(key): value for key, value in (overrides or {}).items()})
    top = {"out", "model", "seed", "stages"}
    stage_names = [s.name for s in STAGES] + list(PLANNED)
    for key in data:
        if key not in top and key not in stage_names:
            raise ConfigError(f"unknown config key {key!r}{suggest(str(key), sorted(top) + stage_names)}")
    chosen = coerce(data.get("stages") or [s.name for s in STAGES if s.default_on], tuple[str, ...], "stages")
    stages = tuple(canonical_stage(str(name).strip()) for name in chosen if str(name).strip())
    for name in stages:
        stage_by_name(name)
    from arithmech.models.model_config import ModelConfig

    model = typed_settings(ModelConfig, data.get("model"), "model")
    ModelConfig(**model)  # a bad value (e.g. dtype) is refused here, before torch is imported
    if model.get("max_memory") is not None:
        from arithmech.plan.sizes import parse_size

        parse_size(model["max_memory"])
    seed = coerce(data.get("seed", 0), int, "seed")
    settings = {s.name: build_stage_config(s, data.get(s.name), seed) for s in STAGES if s.name in stages}
    read = {n for s in STAGES if s.name in stages for n in (*needs_of(s, settings[s.name]), *s.reads)
            if n not in stages and data.get(n)}  # fmt: skip
    given = {n: typed_settings(_config_class(stage_by_name(n)), data[n], n) for n in sorted(read)}
    out = coerce(data.get("out", "runs/pipeline"), str, "out")
    return RunConfig(out=out, model=model, seed=seed, stages=stages, settings=settings, given=given)


def _check_given(run_dir: Path, given: dict[str, dict[str, Any]]) -> None:
    """Refuse settings given for a stage not run whose finished folder was made with other values."""

    def plain(value: Any) -> Any:
        return json.loads(json.dumps(value, default=str))

    for name, values in given.items():
        metadata = read_metadata(run_dir / name) or {}
        recorded = metadata.get("config") if isinstance(metadata.get("config"), dict) else {}
        for key, value in values.items():
            if key in recorded and plain(recorded[key]) != plain(value):
                raise ConfigError(
                    f"{name}.{key} is {plain(value)!r} in this config, but {str(run_dir / name)!r} was made with "
                    f"{recorded[key]!r} and stages leaves {name} out; add {name} to stages to rerun it, or drop "
                    f"{name}.{key}"
                )


def _result_print(name: str, out: Path) -> str | None:
    """The fingerprint of what a finished stage folder holds, for the stages whose results are read by content
    (identify: `lineage.identify_fingerprint`); None for the others."""
    return identify_fingerprint(out) if name == "identify" and (out / "metadata.json").is_file() else None


def _canonical_key(key: str) -> str:
    """"mediation.n_pairs" -> "mediate.n_pairs": an override's stage alias replaced by the stage's name."""
    head, dot, rest = key.partition(".")
    return canonical_stage(head) + dot + rest


def _canonical_keys(data: dict[str, Any]) -> dict[str, Any]:
    """The config with stage aliases as settings keys renamed to the stage's name; both at once is an error."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = canonical_stage(str(key))
        if name in out:
            raise ConfigError(f"config keys {name!r} and {key!r} name the same stage; keep one of them")
        out[name] = value
    return out


def _load(quiet: bool = False, **model: Any) -> Any:
    """Keyword arguments only: `distributed.local_device` changes its `device`."""
    from arithmech.models.load import load_model
    from arithmech.models.model_config import ModelConfig

    return load_model(ModelConfig(**model), quiet=quiet)


def fingerprint(stage: Stage, cfg: Any, model: dict[str, Any], upstream: dict[str, str]) -> str:
    """What decides a stage's result: its settings, the model, the stages it reads, and the code version (not
    max_memory: the sizes it chooses cut the same work into other passes, with the same numbers)."""
    from arithmech import __version__

    loaded = {k: v for k, v in model.items() if k != "max_memory"}
    payload = {"stage": stage.name, "config": dataclasses.asdict(cfg), "model": loaded, "upstream": upstream,
               "version": __version__}  # fmt: skip
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


ONE_ANSWER_TOKEN = ("mlp", "fourier", "agreement")
"""Stages that read one answer token per identify prompt, so not a run of identify.answer_digits."""


def _check_answer_digits(cfg: RunConfig, run_dir: Path) -> None:
    """Refuse, before a model loads, a stage of ONE_ANSWER_TOKEN reading an identify run of answer digits: the
    one this run makes, or (identify left out of stages) the one already in the run folder."""
    identify = cfg.settings.get("identify")
    clash = [name for name in ONE_ANSWER_TOKEN if name in cfg.stages]
    if not clash:
        return
    if "identify" not in cfg.stages:
        if (run_dir / "identify" / "metadata.json").is_file():
            refuse_answer_digits(run_dir / "identify", f"the stage {clash[0]!r}")
        return
    if identify is not None and getattr(identify, "answer_digits", False):
        raise ConfigError(
            f"identify.answer_digits scores the answers token by token, and the stage {clash[0]!r} reads one answer "
            f"token per prompt; leave {', '.join(clash)} out of stages, or set identify.answer_digits to false"
        )


def _check_split(cfg: RunConfig, run_dir: Path) -> None:
    """Refuse, before a model loads, arithmetic benchmarks of evaluate on another split than the one the finetune
    stage trains on (this run's settings) or trained on (a finished finetune folder left out of stages)."""
    evaluate, finetune = cfg.settings.get("evaluate"), cfg.settings.get("finetune")
    if evaluate is None:
        return
    if finetune is not None:
        if finetune.data == "arithmetic":
            from arithmech.data.arithmetic_split import make_split

            trained = {"seed": finetune.split_seed, "fingerprint": make_split(finetune.split_seed).fingerprint}
            evaluate.refuse_other_split(trained, "the finetune stage", prefix="evaluate.")
    elif (run_dir / "finetune" / "metadata.json").is_file():
        from arithmech.stages.evaluate_config import trained_split

        trained = trained_split(run_dir / "finetune")
        if trained is not None:
            evaluate.refuse_other_split(trained, f"{str(run_dir / 'finetune')!r}", prefix="evaluate.")


def run_pipeline(cfg: RunConfig, quiet: bool = False, handle: Any = None) -> dict[str, Any]:
    """Run the chosen stages in order into cfg.out, skipping those already done with the same fingerprint.

    Returns {stage: result} for the stages that ran; skipped stages map to their folder's Path. The model is
    loaded only when a stage has to run (or `handle` is used if given), after every path was checked.
    """
    run_dir = preflight.out_folder(cfg.out, option="out", stage="pipeline")
    settings = {name: preflight.stage_paths(c, prefix=name, skip=_INJECTED) for name, c in cfg.settings.items()}
    _check_given(run_dir, cfg.given)
    _check_answer_digits(cfg, run_dir)
    _check_split(cfg, run_dir)
    _check_needs(cfg, settings, run_dir)
    fits = _within_budget(cfg, settings, run_dir, handle)
    with run_lock.held(run_dir, "out"):  # creates it
        return _run_stages(cfg, run_dir, settings, fits, quiet, handle)


def _check_needs(cfg: RunConfig, settings: dict[str, Any], run_dir: Path) -> None:
    """Refuse a stage whose inputs neither run before it (STAGES is in run order) nor lie finished in the folder."""
    for stage in STAGES:
        if stage.name in cfg.stages:
            needs = needs_of(stage, settings[stage.name])
            missing = [n for n in needs if n not in cfg.stages and not (run_dir / n / "metadata.json").is_file()]
            if missing:
                raise ConfigError(f"stage {stage.name!r} reads the {missing[0]!r} stage's results; add it to stages")


@dataclass(frozen=True)
class _Fits:
    """Every chosen stage's config fitted to the run's memory budget, and how to fit a stage again."""

    budget: Any
    """The `plan.budget.MemoryBudget`, or why there is none."""
    configs: dict[str, Any]
    """Stage name -> its config as given."""
    fits: dict[str, Any]
    """Stage name -> its `BudgetFit`."""
    copies: dict[str, int]
    """Stage name -> the copies of the model held beside it."""
    estimated: frozenset[str]
    """Stages fitted at a bound on an identify run not made yet (its settings), fitted again once it is."""

    def fit(self, name: str, run_dir: Path) -> Any:
        """The stage's fit; where it was fitted at a bound, fitted again at the identify run's prompts, which are
        on disk now (the bound still counts every prompt identify keeps, but knockout's held-out ones are drawn
        afresh)."""
        if name not in self.estimated:
            return self.fits[name]
        from arithmech.plan.budget import fit_or_keep

        return fit_or_keep(self.budget, self.configs[name], self.copies[name], name, run_dir / "identify")


def _within_budget(cfg: RunConfig, settings: dict[str, Any], run_dir: Path, handle: Any) -> _Fits:
    """Every chosen stage's sizes fitted to model.max_memory (or the device's free memory) before the model loads
    (plan/budget.py), so a stage that cannot fit stops the run before any runs; finetune trains a copy of the
    model, and evaluate scores a tuned copy beside the base model when there is a finetune. A stage that reads
    identify's prompts is planned at them: at the folder's, or at identify's settings when it runs first."""
    from arithmech.models.model_config import ModelConfig
    from arithmech.plan.budget import before_load, fit_or_keep, of_loaded
    from arithmech.plan.prompt_widths import READS_IDENTIFY

    given = cfg.model.get("max_memory")
    budget = before_load(ModelConfig(**cfg.model)) if handle is None else of_loaded(handle, given, "--max-memory")
    tuned = "finetune" in cfg.stages or (run_dir / "finetune" / "metadata.json").is_file()
    copies = {name: int(name == "finetune" or name == "evaluate" and tuned) for name in settings}
    identify = settings["identify"] if "identify" in cfg.stages else run_dir / "identify"
    readers = {name for name in settings if name in READS_IDENTIFY}
    fits = {name: fit_or_keep(budget, c, copies[name], name, identify if name in readers else None)
            for name, c in settings.items()}  # fmt: skip
    estimated = frozenset(readers if "identify" in cfg.stages else ())
    return _Fits(budget, settings, fits, copies, estimated)


def _run_stages(
    cfg: RunConfig, run_dir: Path, settings: dict[str, Any], fits: _Fits, quiet: bool, handle: Any
) -> dict[str, Any]:
    """The loop of `run_pipeline`, in a run folder checked and locked; each stage runs with its sizes in `fits`."""
    record_path = run_dir / "pipeline.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    done: dict[str, Any] = record.get("stages", {})
    prints: dict[str, str] = {}
    results: dict[str, Any] = {}
    for stage in STAGES:
        if stage.name not in cfg.stages:
            continue
        stage_cfg = settings[stage.name]
        needs = needs_of(stage, stage_cfg)
        used = [*needs, *(n for n in stage.reads if n in prints or (run_dir / n / "metadata.json").is_file())]
        upstream = {n: prints.get(n) or _result_print(n, run_dir / n) or done.get(n, {}).get("fingerprint", "")
                    for n in used}  # fmt: skip
        mark = fingerprint(stage, stage_cfg, cfg.model, upstream)
        out = run_dir / stage.name
        kept = done.get(stage.name, {})
        held = _result_print(stage.name, out)  # what the folder holds now: another command may have replaced it
        if kept.get("fingerprint") == mark and (out / "metadata.json").is_file() and kept.get("result", held) == held:
            logger.info("%s: unchanged since the last run, kept %s", stage.name, out)
            results[stage.name] = out
            prints[stage.name] = held or mark
            continue
        if handle is None:
            handle = distributed.local_device(functools.partial(_load, quiet=quiet, **cfg.model))()
        if done.pop(stage.name, None) is not None and distributed.is_main():
            # until its new record is written the folder may hold a mix of old and new files: never keep it
            atomic_write_json(record_path, {"model": cfg.model, "seed": cfg.seed, "stages": done})
        logger.info("%s: running into %s", stage.name, out)
        start = time.perf_counter()
        if stage.sharded or distributed.is_main():
            fit = fits.fit(stage.name, run_dir)
            results[stage.name] = stage.run(handle, fit.cfg, out, run_dir, quiet or not distributed.is_main())
            fit.record(out)
        distributed.barrier()  # under a launch, every process waits until the stage's folder is complete
        held = _result_print(stage.name, out)
        prints[stage.name] = held or mark
        done[stage.name] = {"fingerprint": mark, "seconds": round(time.perf_counter() - start, 1),
                            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **({"result": held} if held else {})}
        if distributed.is_main():
            atomic_write_json(record_path, {"model": cfg.model, "seed": cfg.seed, "stages": done})
    return results
