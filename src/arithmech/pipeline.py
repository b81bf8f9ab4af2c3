"""The whole study in one run folder: identify -> knockout -> transfer -> analysis -> mediation -> ... -> evaluate.

A run is described by one YAML file (or the same keys given as flags), for example:

    model: {model: null, device: cpu, dtype: float32}   # ModelConfig fields; null = built-in default model
    out: runs/demo
    seed: 0                                             # given to every stage that has a seed
    stages: [identify, knockout, attention, mlp]        # default: every stage in STAGES except finetune
    identify: {operations: [addition], fraction_threshold: 0.1}
    knockout: {max_k: 16, n_random: 3}

A stage may also be named after the command that runs it alone: `mediate` for mediation, `analyze attention`,
`analyze mlp` and `analyze agreement` (or with - or _ for the space) for attention, mlp and agreement; in
`stages`, as a settings key and in --set, e.g. --set mediate.n_pairs=8. The folder and the record always use
the stage's own name (STAGE_ALIASES).

Each stage writes into <out>/<stage>/ and its own metadata.json last. After a stage finishes, its fingerprint
(a hash of its settings, the model settings, the fingerprints of the stages it reads and the arithmech
version) is recorded in <out>/pipeline.json; a later run skips a stage whose fingerprint is unchanged and whose
folder is complete, reruns it otherwise, and so resumes an interrupted run where it stopped (stages that scan
for long also resume inside themselves from <stage>/.partial). A stage about to run again loses its record
first, so a run stopped at any point (Ctrl-C, a full disk) never keeps a folder that holds a mix of old and
new files. A stage whose code is not in this version is reported as unavailable, never faked.

Python API: `load_run_config(path, overrides)` -> RunConfig, `run_pipeline(cfg)` -> {stage: result}.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import importlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from arithmech import distributed
from arithmech.errors import ConfigError
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
    Stage("identify", "arithmech.stages.identify:IdentifyConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.identify:identify", h, c, o, quiet=q), sharded=True),
    Stage("knockout", "arithmech.stages.knockout:KnockoutConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.knockout:knockout", h,
                                      _with(c, from_run=str(r / "identify")), o, quiet=q),
          needs=("identify",), sharded=True),
    Stage("transfer", "arithmech.stages.transfer:TransferConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.transfer:transfer", h,
                                      _with(c, sources=(str(r / "identify"),)), o, quiet=q),
          needs=("identify",)),
    Stage("attention", "arithmech.stages.analyze_attention:AttentionConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.analyze_attention:analyze_attention", h, c,
                                      r / "identify", o, quiet=q),
          needs=("identify",)),
    Stage("mlp", "arithmech.stages.analyze_mlp:AnalyzeMlpConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.analyze_mlp:analyze_mlp", h, c, r / "identify", o, quiet=q),
          needs=("identify",)),
    Stage("mediation", "arithmech.stages.mediate:MediateConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.mediate:mediate", h, c, o, quiet=q), sharded=True),
    Stage("agreement", "arithmech.stages.agreement:AgreementConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.agreement:method_agreement", h,
                                      _with(c, from_run=str(r / "identify")), o, quiet=q),
          needs=("identify",)),
    Stage("neurons", "arithmech.stages.neurons:NeuronsConfig",
          lambda h, c, o, r, q: _call("arithmech.stages.neurons:neurons", h, c, o, quiet=q)),
    Stage("finetune", "arithmech.stages.finetune:FinetuneConfig",
          lambda h, c, o, r, q: _finetune(h, c, o, r, q), needs=("identify",), default_on=False, sharded=True),
    Stage("evaluate", "arithmech.stages.evaluate:EvaluateConfig",
          lambda h, c, o, r, q: _evaluate(h, c, o, r, q), reads=("finetune",)),
)  # fmt: skip
"""Every stage in run order. finetune is off unless named in `stages` (it is the slow one)."""

PLANNED: tuple[str, ...] = ()
"""Stages a user may name that this version does not have yet."""

STAGE_ALIASES: dict[str, str] = {
    "mediate": "mediation",
    **{f"analyze{sep}{name}": name for name in ("attention", "mlp", "agreement") for sep in (" ", "-", "_")},
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
        from arithmech.finetune.delta import apply_delta

        tuned = apply_delta(copy.deepcopy(handle.model), delta)
        tuned_handle = ModelHandle(tuned, handle.tokenizer, type(handle.view)(tuned, handle.view.spec), handle.source)
        results["tuned"] = _call("arithmech.stages.evaluate:evaluate_stage", tuned_handle, cfg, out / "tuned",
                                 quiet=quiet, base_handle=handle)  # fmt: skip
    from arithmech.runs import atomic_write_json

    atomic_write_json(out / "metadata.json", {"stage": "evaluate", "models": sorted(results)})
    return results


_PLACEHOLDER = "<from the pipeline>"
_INJECTED = {"from_run", "sources"}  # config fields the pipeline fills with upstream folders


@dataclass(frozen=True)
class RunConfig:
    """A whole run: the model, the output folder, which stages, and each stage's settings."""

    out: str = field(default="runs/pipeline", metadata={"help": "run folder; each stage gets a subfolder"})
    model: dict[str, Any] = field(default_factory=dict, metadata={"help": "ModelConfig fields"})
    seed: int = field(default=0, metadata={"help": "seed given to every stage that has one"})
    stages: tuple[str, ...] = field(default=(), metadata={"help": "stages to run; default every default-on stage"})
    settings: dict[str, Any] = field(default_factory=dict, metadata={"help": "stage name -> its config object"})


def stage_by_name(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == canonical_stage(name):
            return stage
    if name in PLANNED:
        raise ConfigError(f"stage {name!r} is not available in this version of arithmech; leave it out of stages")
    raise ConfigError(f"unknown stage {name!r}{_suggest(name, [s.name for s in STAGES])}")


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; choose from {', '.join(choices)}"


def _config_class(stage: Stage) -> type:
    module, name = stage.config.split(":")
    return getattr(importlib.import_module(module), name)


def _tuples(value: Any) -> Any:
    """YAML lists -> tuples, since stage configs are frozen dataclasses with tuple fields."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def build_stage_config(stage: Stage, values: dict[str, Any], seed: int) -> Any:
    """The stage's config object from YAML values; an unknown key is named with the closest real one."""
    cls = _config_class(stage)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in names:
            raise ConfigError(f"{stage.name} has no setting {key!r}{_suggest(key, names)}")
    values = _tuples(dict(values))
    if "seed" in names:
        values.setdefault("seed", seed)
    for name in _INJECTED & set(names):
        values.setdefault(name, _PLACEHOLDER if name == "from_run" else (_PLACEHOLDER,))
    return cls(**values)


def load_run_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run description (optional) and apply `overrides` ("identify.max_prompts" -> 32, "out" -> ...)."""
    data: dict[str, Any] = {}
    if path is not None:
        source = Path(path)
        if not source.is_file():
            raise ConfigError(f"config file {str(source)!r} does not exist; give the path of a YAML file")
        try:
            data = yaml.safe_load(source.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(source)!r} is not valid YAML ({err.__class__.__name__})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(source)!r} must be a mapping of settings, e.g. 'out: runs/x'")
    data = _canonical_keys(data)
    for key, value in (overrides or {}).items():
        head, dot, rest = key.partition(".")
        key = canonical_stage(head) + dot + rest
        target = data
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    top = {"out", "model", "seed", "stages"}
    stage_names = [s.name for s in STAGES] + list(PLANNED)
    for key in data:
        if key not in top and key not in stage_names:
            raise ConfigError(f"unknown config key {key!r}{_suggest(key, sorted(top) + stage_names)}")
    chosen = data.get("stages") or [s.name for s in STAGES if s.default_on]
    if isinstance(chosen, str):
        chosen = chosen.split(",")
    stages = tuple(canonical_stage(str(name).strip()) for name in chosen if str(name).strip())
    for name in stages:
        stage_by_name(name)
    model = dict(data.get("model") or {})
    from arithmech.models.load import ModelConfig

    known = [f.name for f in dataclasses.fields(ModelConfig)]
    for key in model:
        if key not in known:
            raise ConfigError(f"model has no setting {key!r}{_suggest(key, known)}")
    seed = int(data.get("seed", 0))
    settings = {s.name: build_stage_config(s, data.get(s.name) or {}, seed) for s in STAGES if s.name in stages}
    out = str(data.get("out", "runs/pipeline"))
    return RunConfig(out=out, model=model, seed=seed, stages=stages, settings=settings)


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
    from arithmech.models.load import ModelConfig, load_model

    return load_model(ModelConfig(**model), quiet=quiet)


def fingerprint(stage: Stage, cfg: Any, model: dict[str, Any], upstream: dict[str, str]) -> str:
    """What decides a stage's result: its settings, the model, the stages it reads, and the code version."""
    from arithmech import __version__

    payload = {"stage": stage.name, "config": dataclasses.asdict(cfg), "model": model, "upstream": upstream,
               "version": __version__}  # fmt: skip
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_pipeline(cfg: RunConfig, quiet: bool = False, handle: Any = None) -> dict[str, Any]:
    """Run the chosen stages in order into cfg.out, skipping those already done with the same fingerprint.

    Returns {stage: result} for the stages that ran; skipped stages map to their folder's Path. The model is
    loaded only when a stage has to run (or `handle` is used if given).
    """
    run_dir = Path(cfg.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    record_path = run_dir / "pipeline.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    done: dict[str, Any] = record.get("stages", {})
    prints: dict[str, str] = {}
    results: dict[str, Any] = {}
    for stage in STAGES:
        if stage.name not in cfg.stages:
            continue
        missing = [n for n in stage.needs if n not in prints and not (run_dir / n / "metadata.json").is_file()]
        if missing:
            raise ConfigError(f"stage {stage.name!r} reads the {missing[0]!r} stage's results; add it to stages")
        used = [*stage.needs, *(n for n in stage.reads if n in prints or (run_dir / n / "metadata.json").is_file())]
        upstream = {n: prints.get(n) or done.get(n, {}).get("fingerprint", "") for n in used}
        stage_cfg = cfg.settings[stage.name]
        mark = fingerprint(stage, stage_cfg, cfg.model, upstream)
        prints[stage.name] = mark
        out = run_dir / stage.name
        if done.get(stage.name, {}).get("fingerprint") == mark and (out / "metadata.json").is_file():
            logger.info("%s: unchanged since the last run, kept %s", stage.name, out)
            results[stage.name] = out
            continue
        if handle is None:
            handle = distributed.local_device(functools.partial(_load, quiet=quiet, **cfg.model))()
        if done.pop(stage.name, None) is not None and distributed.is_main():
            # until its new record is written the folder may hold a mix of old and new files: never keep it
            atomic_write_json(record_path, {"model": cfg.model, "seed": cfg.seed, "stages": done})
        logger.info("%s: running into %s", stage.name, out)
        start = time.perf_counter()
        if stage.sharded or distributed.is_main():
            results[stage.name] = stage.run(handle, stage_cfg, out, run_dir, quiet or not distributed.is_main())
        distributed.barrier()  # under a launch, every process waits until the stage's folder is complete
        done[stage.name] = {"fingerprint": mark, "seconds": round(time.perf_counter() - start, 1),
                            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
        if distributed.is_main():
            atomic_write_json(record_path, {"model": cfg.model, "seed": cfg.seed, "stages": done})
    return results
