"""The Python front door: one function per stage, taking the stage's settings as keyword arguments.

Usage:
    >>> import arithmech as am
    >>> model = am.load_model()                                   # built-in SmolLM2-135M-Instruct
    >>> found = am.identify(model, max_prompts=32, out="runs/nb/identify")
    >>> curve = am.knockout(model, from_run="runs/nb/identify", max_k=8, out="runs/nb/knockout")
    >>> run = am.open_run("runs/nb")                              # the tables as pandas DataFrames
    >>> run.identify.effects.nsmallest(5, "effect")

Each function is a thin wrapper over the stage function the CLI and `arithmech run` call
(`arithmech.stages.<stage>`): its keyword settings are the fields of the stage's config class (the same names as
the command's options, with _ for -), checked with the same one-sentence errors before any work starts, and it
returns the stage's typed result after writing the run folder `out`. Its other arguments are checked at the door
too (`arguments.py`): a model name where a loaded model belongs, or an `out` that is no path, is one sentence.
torch is imported only when a stage runs, so `import arithmech` stays fast.

Every stage function also takes `max_memory` ("24GB", or bytes), as the commands' --max-memory: the stage lowers
its batch and chunk sizes until its planned peak fits (plan/budget.py), or refuses in one sentence before any work;
by default the budget is what the model's device has free, its loaded weights counted in.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arithmech import arguments, preflight, run_lock
from arithmech.config_values import typed_settings

if TYPE_CHECKING:
    from arithmech.evaluate.runner import EvalResult
    from arithmech.models.load import ModelHandle
    from arithmech.stages.agreement import AgreementResult
    from arithmech.stages.analyze_attention import AttentionResult
    from arithmech.stages.analyze_mlp import MlpLensResult
    from arithmech.stages.circuit import CircuitResult
    from arithmech.stages.finetune import FinetuneResult
    from arithmech.stages.fourier import FourierResult
    from arithmech.stages.heuristics import HeuristicsResult
    from arithmech.stages.identify import IdentifyResult
    from arithmech.stages.knockout import KnockoutResult
    from arithmech.stages.mediate import MediateResult
    from arithmech.stages.neurons import NeuronsResult
    from arithmech.stages.numbers import NumbersResult
    from arithmech.stages.transfer import TransferResult

RunSource = str | Path | Any
"""An identify run: its folder, a run folder holding identify/, or the result `identify` returned."""
Out = str | Path | None
"""The folder a stage writes; None: the command's default."""


def load_model(
    model: str | None = None,
    *,
    gguf_file: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    revision: str | None = None,
    threads: int | None = None,
    quiet: bool = False,
) -> ModelHandle:
    """Load a causal LM with its tokenizer and architecture spec, as the `--model` options of every command do.

    Args:
        model: Hub id, local folder or .gguf file; None loads the built-in SmolLM2-135M-Instruct.
        gguf_file: GGUF file name inside the `model` folder or hub repo.
        device: cpu, cuda, cuda:N, or auto (spread over all visible GPUs).
        dtype: float32, float16, bfloat16 or auto (the checkpoint's own).
        revision: Hub revision (branch, tag or commit).
        threads: CPU threads torch uses; None keeps torch's own choice.
        quiet: no library progress bars or stderr output while loading.
    """
    for name, value in (("model", model), ("gguf_file", gguf_file), ("revision", revision)):
        arguments.text(value, f"load_model's {name}", optional=True)
    arguments.text(device, "load_model's device")
    arguments.text(dtype, "load_model's dtype")
    arguments.whole(threads, "load_model's threads", optional=True)
    arguments.flag(quiet, "load_model's quiet")
    from arithmech.models.model_config import ModelConfig

    cfg = ModelConfig(model=model, gguf_file=gguf_file, device=device, dtype=dtype, revision=revision)
    from arithmech.models.load import load_model as load
    from arithmech.models.load import set_threads

    set_threads(threads)
    return load(cfg, quiet=quiet)


def _config(config: str, stage: str, settings: dict[str, Any], **injected: Any) -> Any:
    """The stage's config object from keyword settings (each checked against its field's type)."""
    module, name = config.split(":")
    cls = getattr(importlib.import_module(f"arithmech.stages.{module}"), name)
    return cls(**typed_settings(cls, settings, stage), **injected)


def _call(target: str, out_dir: Path, model: ModelHandle, cfg: Any, *args: Any, max_memory: Any = None,
          identify_run: Path | None = None, **kwargs: Any) -> Any:  # fmt: skip
    """The stage function `target` on `cfg` with its sizes fitted to `max_memory` (plan/budget.py), writing into
    `out_dir`, which `preflight.check` locked: released however the stage ends (an exception, Ctrl-C), so a failed
    call leaves neither a lock file nor a folder made only for it. `identify_run`: the run an analysis reads, where
    its config does not name it (its prompts set the widest batch the budget plans)."""
    from arithmech.plan.budget import fit_or_keep, of_loaded

    module, name = target.split(":")
    try:
        fit = fit_or_keep(of_loaded(model, arguments.size(max_memory, "max_memory")), cfg, identify=identify_run)
        result = getattr(importlib.import_module(f"arithmech.stages.{module}"), name)(model, fit.cfg, *args, **kwargs)
        fit.record(out_dir)
        return result
    finally:
        run_lock.release(out_dir)


def _folder(source: RunSource, name: str = "from_run") -> str:
    """The path of an identify run given as a path or as identify's result."""
    return arguments.run_source(source, name)


def _default_out(stage: str) -> Path:
    return Path("runs") / time.strftime(f"{stage}-%Y%m%d-%H%M%S")


def _door(function: str, model: Any, out: Out, quiet: Any) -> Path | None:
    """A stage function's own arguments checked: the loaded model, `out` (returned as a Path) and `quiet`."""
    arguments.model_handle(model, function)
    arguments.flag(quiet, f"{function}'s quiet")
    return arguments.path(out, f"{function}'s out", optional=True)


def _standalone(stage: str, config: str, target: str, model: ModelHandle, out: Out, quiet: bool,
                settings: dict[str, Any], **injected: Any) -> Any:  # fmt: skip
    """Run a stage that writes its own folder (default `runs/<stage>-<time>`), its settings checked first."""
    max_memory = settings.pop("max_memory", None)
    checked = _config(config, stage, settings, **injected)
    out = _door({"heuristics": "analyze_heuristics", "numbers": "analyze_numbers"}.get(stage, stage), model, out, quiet)
    cfg, out_dir = preflight.check(checked, out or _default_out(stage), stage)
    return _call(target, out_dir, model, cfg, out_dir, quiet=quiet, max_memory=max_memory)


def identify(model: ModelHandle, *, out: Out = None, quiet: bool = False, **settings: Any) -> IdentifyResult:
    """Path-patch every attention head and MLP at the last token and write the key components.

    Settings are the fields of `IdentifyConfig` (`arithmech identify --help`): operations, max_prompts, variant,
    method, fraction_threshold, ... Returns an IdentifyResult (`.key.ranked`, `.key.total_effect`, `.out_dir`).
    `out` defaults to `runs/identify-<time>`.
    """
    return _standalone("identify", "identify_config:IdentifyConfig", "identify:identify", model, out, quiet, settings)


def knockout(
    model: ModelHandle,
    from_run: RunSource | None = None,
    *,
    out: Out = None,
    quiet: bool = False,
    **settings: Any,
) -> KnockoutResult:
    """Knock out the top-k components by effect vs k random ones and record accuracy (the knockout curve).

    `from_run` is the identify run whose ranking and prompts are used (or give `components=[...]`); the curve is
    scored on held-out prompts (facts the ranking never saw) and on the ranked ones (`result.curve("held_out")`,
    `result.curve("in_sample")`). Settings are the fields of `KnockoutConfig`: max_k, n_random, ablation,
    max_prompts, held_out, ... Returns a KnockoutResult; `out` defaults to `runs/knockout-<time>`.
    """
    run = {"from_run": _folder(from_run)} if from_run is not None else {}
    return _standalone("knockout", "knockout_config:KnockoutConfig", "knockout:knockout", model, out, quiet, settings,
                       **run)  # fmt: skip


def transfer(
    model: ModelHandle, *from_runs: RunSource, out: Out = None, quiet: bool = False, **settings: Any
) -> TransferResult:
    """Knock out the components found by one or more identify runs on other prompt sets (formations, operations,
    word problems). Settings are the fields of `TransferConfig`: targets, k, ablation, ..."""
    sources = {"sources": tuple(_folder(r, "transfer's runs") for r in from_runs)} if from_runs else {}
    return _standalone("transfer", "transfer_config:TransferConfig", "transfer:transfer", model, out, quiet, settings,
                       **sources)  # fmt: skip


def _analysis(
    stage: str, config: str, target: str, model: ModelHandle, from_run: RunSource, out: Out,
    quiet: bool, settings: dict[str, Any], one_answer_token: bool = True,
) -> Any:  # fmt: skip
    """An analysis of an identify run's prompts, written to `out` (default `<from_run>/<stage>`)."""
    max_memory = settings.pop("max_memory", None)
    cfg = _config(config, stage, settings)
    out = _door(f"analyze_{stage}", model, out, quiet)
    folder = _folder(from_run)
    command = next(name for name, sub in preflight.SUBFOLDERS.items() if sub == stage)  # "analyze-mlp"
    run_dir, out_dir = preflight.check_reading(folder, out or Path(folder) / stage, command,
                                               one_answer_token=one_answer_token)  # fmt: skip
    return _call(target, out_dir, model, cfg, run_dir, out_dir, quiet=quiet, max_memory=max_memory,
                 identify_run=run_dir)


def analyze_attention(
    model: ModelHandle, from_run: RunSource, *, out: Out = None, quiet: bool = False, **settings: Any
) -> AttentionResult:
    """Where each key head looks from the last token: operand A, operand B, operator, prefix.

    Settings are the fields of `AttentionConfig`: heads, top_k, tau, max_prompts, ... `out` defaults to
    `<from_run>/attention`.
    """
    return _analysis("attention", "analyze_attention_config:AttentionConfig", "analyze_attention:analyze_attention",
                     model, from_run, out, quiet, settings, one_answer_token=False)  # fmt: skip


def analyze_mlp(
    model: ModelHandle, from_run: RunSource, *, out: Out = None, quiet: bool = False, **settings: Any
) -> MlpLensResult:
    """MLP logit lens: do MLP inputs point at the operands and MLP updates at the answer?

    Settings are the fields of `AnalyzeMlpConfig`: layers, max_prompts, max_number, ... `out` defaults to
    `<from_run>/mlp`.
    """
    return _analysis("mlp", "analyze_mlp_config:AnalyzeMlpConfig", "analyze_mlp:analyze_mlp", model, from_run, out,
                     quiet, settings)  # fmt: skip


def analyze_fourier(
    model: ModelHandle, from_run: RunSource, *, out: Out = None, quiet: bool = False, **settings: Any
) -> FourierResult:
    """Fourier features of each attention and MLP output over the number tokens, and accuracy with frequencies
    filtered out. Settings are the fields of `FourierConfig`; `out` defaults to `<from_run>/fourier`."""
    return _analysis("fourier", "fourier_config:FourierConfig", "fourier:analyze_fourier", model, from_run, out,
                     quiet, settings)  # fmt: skip


def analyze_agreement(
    model: ModelHandle, from_run: RunSource, *, out: Out = None, quiet: bool = False, **settings: Any
) -> AgreementResult:
    """How far path patching, attribution patching, zero ablation and mediation agree (Spearman, top-k overlap).

    Settings are the fields of `AgreementConfig`: methods, max_prompts, ks, ... `out` defaults to
    `<from_run>/agreement`.
    """
    folder = _folder(from_run)
    max_memory = settings.pop("max_memory", None)
    checked = _config("agreement_config:AgreementConfig", "agreement", settings, from_run=folder)
    out = _door("analyze_agreement", model, out, quiet)
    cfg, out_dir = preflight.check(checked, out or Path(folder) / "agreement", "agreement")
    return _call("agreement:method_agreement", out_dir, model, cfg, out_dir, quiet=quiet, max_memory=max_memory)


def analyze_heuristics(model: ModelHandle, *, out: Out = None, quiet: bool = False,
                       **settings: Any) -> HeuristicsResult:  # fmt: skip
    """Heuristic neurons: which MLP neurons fire on operand patterns and how the answer depends on them.

    Settings are the fields of `HeuristicsConfig`; `out` defaults to `runs/heuristics-<time>`.
    """
    return _standalone("heuristics", "heuristics_config:HeuristicsConfig", "heuristics:heuristics", model, out, quiet,
                       settings)  # fmt: skip


def analyze_numbers(model: ModelHandle, *, out: Out = None, quiet: bool = False, **settings: Any) -> NumbersResult:
    """How the model represents the numbers it adds: linear, log, circles, helices (Kantamneni & Tegmark 2025),
    PCA and polynomials of equal size and per-digit circles, each fitted at the operand tokens and judged by the
    logit difference its patch restores, with held-out, shuffled-order, other-position and ablation controls.

    Settings are the fields of `NumbersConfig`; `out` defaults to `runs/numbers-<time>`.
    """
    return _standalone("numbers", "numbers_config:NumbersConfig", "numbers:analyze_numbers", model, out, quiet,
                       settings)  # fmt: skip


def mediate(model: ModelHandle, *, out: Out = None, quiet: bool = False, **settings: Any) -> MediateResult:
    """Causal mediation per layer (total, direct, indirect effects) for arithmetic, retrieval and facts.

    Settings are the fields of `MediateConfig`: n_pairs, neuron_k, few_shot, ... `out` defaults to
    `runs/mediate-<time>`.
    """
    return _standalone("mediate", "mediate_config:MediateConfig", "mediate:mediate", model, out, quiet, settings)


def neurons(model: ModelHandle, *, out: Out = None, quiet: bool = False, **settings: Any) -> NeuronsResult:
    """Head importance per operation, comparative neuron analysis and pruning of the deep MLP neurons.

    Settings are the fields of `NeuronsConfig`: operations, max_prompts, keep_sizes, lora, ... `out` defaults
    to `runs/neurons-<time>`.
    """
    return _standalone("neurons", "neurons_config:NeuronsConfig", "neurons:neurons", model, out, quiet, settings)


def circuit(
    model: ModelHandle,
    identify_run: RunSource | None = None,
    *,
    out: Out = None,
    quiet: bool = False,
    **settings: Any,
) -> CircuitResult:
    """Score every edge of MIB's graph (EAP, EAP-IG, identify's node ranking or random) on MIB's arithmetic
    prompts (the find pairs) and, with evaluate=True, sweep faithfulness (CPR, CMD) on disjoint held-out test
    pairs (in_sample=True: on the find pairs). Settings are the fields of `CircuitConfig`: method,
    compare_methods, n_prompts, test_prompts, evaluate, random_seeds, circuit_file, oracle, ... `identify_run` is
    needed by method "path-patching" (or among compare_methods). `out` defaults to `runs/circuit-<time>`."""
    run = {"identify_run": _folder(identify_run, "identify_run")} if identify_run is not None else {}
    return _standalone("circuit", "circuit_config:CircuitConfig", "circuit:circuit", model, out, quiet, settings, **run)


def finetune(
    model: ModelHandle,
    from_run: RunSource | None = None,
    *,
    out: Out = None,
    quiet: bool = False,
    **settings: Any,
) -> FinetuneResult:
    """Fine-tune only the key heads (precise SFT), or the whole model / LoRA as baselines. This trains `model`
    in place; load another copy to compare. Settings are the fields of `FinetuneConfig`: method, top_k, data,
    epochs, ... `from_run` is the identify run whose top-k heads are trained."""
    run = {"from_run": _folder(from_run)} if from_run is not None else {}
    return _standalone("finetune", "finetune_config:FinetuneConfig", "finetune:finetune", model, out, quiet, settings,
                       **run)  # fmt: skip


def evaluate(model: ModelHandle, *, out: Out = None, quiet: bool = False, **settings: Any) -> EvalResult:
    """Math and general benchmarks (GSM8K, SVAMP, AddSub, SingleEq, MMLU, CommonsenseQA, perplexity/KL).

    Settings are the fields of `EvaluateConfig`: benchmarks, limit, ... `out` defaults to `runs/evaluate-<time>`.
    """
    return _standalone("evaluate", "evaluate_config:EvaluateConfig", "evaluate:evaluate_stage", model, out, quiet,
                       settings)  # fmt: skip


def run(
    config: str | Path | None = None, *, handle: ModelHandle | None = None, quiet: bool = False, **settings: Any
) -> dict[str, Any]:
    """Run the whole study into one run folder, as `arithmech run` does, skipping stages already done.

    `config` is a YAML run description (e.g. configs/default-model.yaml); `settings` override its keys, a
    stage's settings given as a mapping: `am.run(out="runs/x", stages=["identify", "knockout"],
    identify={"max_prompts": 16})`; `model` is the config's model (a hub id, folder or a mapping of load_model's
    settings). A `handle` from `load_model` is used instead of loading the config's model. Returns {stage:
    result} for the stages that ran (a kept stage maps to its folder).
    """
    arguments.path(config, "run's config", optional=True)
    if handle is not None:
        arguments.model_handle(handle, "run")
    arguments.flag(quiet, "run's quiet")
    from arithmech.pipeline import load_run_config, run_pipeline

    overrides: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            overrides.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            overrides[key] = value
    return run_pipeline(load_run_config(config, overrides), quiet=quiet, handle=handle)


def write_report(run_dir: str | Path, out: Out = None) -> Path:
    """Write one self-contained HTML report of a run folder (default `<run_dir>/report.html`); returns its path."""
    folder = arguments.path(run_dir, "write_report's run_dir")
    page = arguments.path(out, "write_report's out", optional=True)
    from arithmech.report.html import write_report as write

    return write(folder, page)
