"""The transfer stage: components identified on one prompt set, knocked out on others (paper sec. 5.1, Fig. 4).

Background
    Zhang et al. (2024, section 5.1) knock out the key heads found on their addition data and report about a
    70% accuracy drop there, and a relative drop of -22.9% / 34.7% = -66% on SVAMP, plus confused answers on
    multi-digit and rational numbers. This stage measures the same thing as a matrix: for every source (an
    identify run folder) and target set (`data/target_sets.py`), the accuracy lost when the source's
    top-k components are knocked out on the target's prompts, beside the random-rank control.

Per target set (the same prompts for every source)
    1-3. Prompts built, filtered and sampled, and their ablation values: `stages/transfer_targets.py`.
    4. Configurations: nothing, each source's effect-rank top-k (its path-patching ranking; heads, or heads
       and MLPs with include_mlps) and n_random random k-subsets of the same pool with as many heads and MLPs
       as the top k (seeded as the knockout stage draws them, `knockout.sweep.draw_like`), deduplicated and
       scored in one batched call (`knockout_scores`, or its shared-prefix twin `end_knockout_scores`).

Held out (step 1 of `stages/transfer_targets.py`)
    A target is scored on prompts that share no prompt and no fact (a problem, its swap or its inverse) with any
    source's ranked prompts (its identify reference set): an "addition" target of an addition source would
    otherwise hold the very prompts the source's components were ranked on (same templates, same seed), an
    in-sample row. replaced_in_sample counts, per row, the prompts of the unrestricted target that the source
    shared and that were replaced by prompts of other facts; metadata.json's targets.<name>.held_out says what was
    excluded (null where a target shares nothing: it is built as before).

Numbers (per source x target)
    unablated   accuracy of the kept prompts with nothing knocked out (1 after filtering)
    effect_drop = (unablated - effect_accuracy) / unablated: the relative drop, i.e. the share of the
                  answered prompts lost (relative to the filtered set's 100%)
    effect_drop_abs = base_accuracy x effect_drop: points of whole-set accuracy lost, assuming prompts the
                  model got wrong stay wrong (without filtering: unablated - effect_accuracy, measured)
    random_*    the same for the random-rank control: mean and sample sd (ddof 1) over seeds.
    k defaults to the number of key heads of the source run (key heads + key MLPs with include_mlps), at
    least 1 and at most 32; which components a source knocks out and why (--k, its key components, or its top
    one by effect when it has none, a warning) is logged and recorded in metadata.json ("why"). A target with
    no prompt kept gives rows of undefined numbers with a note, not an error. In memory an undefined number is
    NaN; in transfer.csv it is an empty cell (also a relative drop from an unablated accuracy of 0, and a
    spread over fewer than 2 random draws), in metadata.json null.

Scoring is by the answer's tokens at END (not greedy generation): the metric identify and knockout use, one
forward pass per (configuration, prompt, answer token). An arithmetic target's multi-token answer ("45", "3.8")
is scored token by token, teacher forced (its earlier tokens appended to the prompt, as identify
--answer-digits): the prompt counts as right when every token is the top token, which is when greedy decoding
writes the whole answer; effect_token_accuracy and random_token_accuracy_mean give the share of answer tokens
right (per digit). Word problems are scored by the answer's first token after the short prefix "Answer: ": a
necessary, not a sufficient, condition of a right answer, so their base accuracy is an upper bound of
exact-match accuracy.

Outputs (atomic): transfer.csv (one row per source x target), transfer.png (effect and random-rank drop
heatmaps), metadata.json last.

Usage
    >>> cfg = TransferConfig(sources=("runs/demo",), targets=("multiplication", "svamp"))
    >>> result = transfer(handle, cfg, "runs/demo-transfer")
    >>> result.rows[0].effect_drop
"""

from __future__ import annotations

import csv
import json
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arithmech.data.heldout import Exclusion
from arithmech.data.target_sets import resolve_word_problems, target_set
from arithmech.errors import ConfigError
from arithmech.knockout.batched import knockout_scores
from arithmech.knockout.end_only import end_knockout_scores
from arithmech.knockout.sweep import draw_like, sample_std
from arithmech.models.load import ModelHandle
from arithmech.models.sites import Component, all_components
from arithmech.runs import atomic_write_json, atomic_write_text, cell, csv_text, defined, git_sha, package_versions
from arithmech.stages.identify_run import IdentifyRun, read_identify_run
from arithmech.stages.transfer_config import K_CAP, TransferConfig, rows_per_pass
from arithmech.stages.transfer_targets import PreparedTarget, prepare_target

logger = logging.getLogger(__name__)


CSV_COLUMNS: tuple[str, ...] = (
    "source", "source_set", "target", "n_prompts", "n_total", "n_answered", "replaced_in_sample", "base_accuracy", "k",
    "unablated_accuracy", "effect_accuracy", "effect_drop", "effect_drop_abs", "random_accuracy_mean",
    "random_accuracy_std", "random_drop", "random_drop_abs", "unablated_prob", "effect_prob",
    "random_prob_mean", "effect_token_accuracy", "random_token_accuracy_mean", "components", "note",
)


@dataclass(frozen=True)
class TransferRow:
    """One cell of the matrix: source components knocked out on a target set."""

    source: str
    source_set: str
    target: str
    n_prompts: int
    n_total: int
    n_answered: int
    base_accuracy: float
    k: int
    unablated_accuracy: float
    effect_accuracy: float
    effect_drop: float
    effect_drop_abs: float
    random_accuracy_mean: float
    random_accuracy_std: float
    random_drop: float
    random_drop_abs: float
    unablated_prob: float
    effect_prob: float
    random_prob_mean: float
    components: str
    note: str
    effect_token_accuracy: float = math.nan
    """Share of answer tokens still the top token (teacher forced): per digit where the accuracies are of whole
    multi-digit answers; equal to effect_accuracy for answers of one token."""
    random_token_accuracy_mean: float = math.nan
    replaced_in_sample: int = 0
    """Prompts of the unrestricted target that shared a fact or a prompt with this source's ranked prompts (in
    sample), replaced by prompts of other facts (`stages/transfer_targets.py` step 1); 0 where none did."""


@dataclass
class TransferResult:
    rows: list[TransferRow]
    out_dir: Path
    metadata: dict[str, Any]

    def matrix(self, column: str) -> tuple[list[str], list[str], list[list[float]]]:
        """(sources, targets, values[source][target]) of one numeric column."""
        sources = list(dict.fromkeys(r.source for r in self.rows))
        targets = list(dict.fromkeys(r.target for r in self.rows))
        cell = {(r.source, r.target): float(getattr(r, column)) for r in self.rows}
        return sources, targets, [[cell[s, t] for t in targets] for s in sources]


@dataclass(frozen=True)
class SourcePlan:
    """What one source knocks out."""

    label: str
    source_set: str
    effect: list[Component]
    randoms: list[list[Component]]
    record: dict[str, Any]
    """The source identify run's record (path, fingerprint, created), for metadata.json."""
    why: str
    """Why these k components: --k, the run's key components, or (none) its top one by effect."""
    excluded: Exclusion
    """Its ranked prompts and their facts, which every target holds out."""


def describe_source(run: IdentifyRun) -> str:
    """The prompt set a run was identified on, e.g. "addition (equation+qa)"."""
    config = run.metadata.get("config", {})
    if config.get("prompts_file"):
        return f"prompts file {Path(config['prompts_file']).name}"
    return f"{'+'.join(config.get('operations', ['?']))} ({'+'.join(config.get('formations', ['?']))})"


def plan_sources(handle: ModelHandle, cfg: TransferConfig) -> list[SourcePlan]:
    """Effect-rank top-k and the random draws of every source run."""
    pool = [c for c in all_components(handle.dims) if cfg.include_mlps or c.head is not None]
    plans = []
    for path in cfg.sources:
        run = read_identify_run(path, handle)
        ranked = run.ranked(None if cfg.include_mlps else "head")
        n_key = len(run.key.get("key_heads", [])) + (len(run.key.get("key_mlps", [])) if cfg.include_mlps else 0)
        k = cfg.k if cfg.k is not None else min(max(n_key, 1), K_CAP, len(ranked))
        if k > min(len(pool), len(ranked)):
            raise ConfigError(f"k={k} is larger than the {min(len(pool), len(ranked))} components to choose from")
        randoms = [draw_like(ranked[:k], pool, f"{cfg.seed}-{k}-{s}") for s in range(cfg.n_random)]
        plans.append(SourcePlan(str(path), describe_source(run), ranked[:k], randoms, run.record,
                                _why_k(run, cfg, n_key, k), Exclusion.of(run.pairs)))  # fmt: skip
        chosen = ", ".join(f"{c.name} ({run.effects[c]:+.1%})" for c in ranked[:k])
        (logger.warning if cfg.k is None and n_key == 0 else logger.info)(
            "transfer from %s knocks out %s: %s", path, chosen, plans[-1].why)
    return plans


def _why_k(run: IdentifyRun, cfg: TransferConfig, n_key: int, k: int) -> str:
    """Why a source knocks out k components (see `plan_sources`), one phrase for the log and metadata.json."""
    kind = "components" if cfg.include_mlps else "heads"
    if cfg.k is not None:
        return f"its top {k} {kind} by effect (--k {cfg.k})"
    if n_key == 0:
        digits = (" (it scored its answers token by token, --answer-digits, so each effect is a mean over every "
                  "answer token, and fewer pass)") if run.answer_digits else ""  # fmt: skip
        return (f"its top {kind[:-1]} by effect, since the run has no key {kind} (rule: {run.key.get('rule', '?')})"
                f"{digits}; give --k N to knock out its top N")  # fmt: skip
    if n_key > k:
        return f"its top {k} of its {n_key} key {kind} (at most {K_CAP}; give --k N for another number)"
    return f"its {k} key {kind} (rule: {run.key.get('rule', '?')})"


def _key(config: list[Component]) -> tuple[Component, ...]:
    return tuple(sorted(config))


def score_target(
    handle: ModelHandle, target: PreparedTarget, plans: list[SourcePlan], cfg: TransferConfig
) -> list[TransferRow]:
    """Every source's row on one prepared target, from one batched knockout call (step 4 above)."""
    configs: list[list[Component]] = [[]]
    index: dict[tuple[Component, ...], int] = {(): 0}
    for plan in plans:
        for config in (plan.effect, *plan.randoms):
            if _key(config) not in index:
                index[_key(config)] = len(configs)
                configs.append(config)
    acc: list[float] = []
    prob: list[float] = []
    per_token: list[float] = []
    batch = target.batch
    if batch is not None:
        size = rows_per_pass(batch.ref_ids.shape[1] - target.prefix_len, cfg.batch_size)
        if target.end_values is not None:
            scores = end_knockout_scores(handle.view, batch, target.end_values, configs, target.prefix_len, size)
        else:
            assert target.sources is not None
            scores = knockout_scores(handle.view, batch, target.sources, configs, size)
        per_token = scores.accuracy.tolist()
        if target.pair_index is not None and len(target.pair_index) > target.n_prompts:
            scores = scores.whole_answers(target.pair_index)  # a prompt is right when every answer token is
        acc, prob = scores.accuracy.tolist(), scores.mean_prob.tolist()
    replaced = target.replaced or (0,) * len(plans)
    return [
        _row(plan, target, acc, prob, index[_key(plan.effect)], [index[_key(r)] for r in plan.randoms],
             cfg.filter_correct, per_token, shared)
        for plan, shared in zip(plans, replaced, strict=True)
    ]


def _row(plan: SourcePlan, target: PreparedTarget, acc: list[float], prob: list[float], effect: int,
         randoms: list[int], filter_correct: bool, per_token: list[float], replaced: int) -> TransferRow:
    """Accuracies [config] of whole answers (and `per_token`, of answer tokens) -> one row; config 0 is the
    unablated run."""
    nan = math.nan
    n = target.n_prompts
    base = target.base_accuracy
    unablated, effect_acc = (acc[0], acc[effect]) if acc else (nan, nan)
    rand = [acc[i] for i in randoms] if acc else []
    rand_mean = statistics.fmean(rand) if rand else nan

    def drops(value: float) -> tuple[float, float]:
        relative = (unablated - value) / unablated if unablated > 0 else nan
        return relative, (base * relative if filter_correct else unablated - value)

    effect_drop, effect_abs = drops(effect_acc)
    random_drop, random_abs = drops(rand_mean)
    return TransferRow(
        source=plan.label, source_set=plan.source_set, target=target.name, n_prompts=n, n_total=target.n_total,
        n_answered=target.n_answered, base_accuracy=base, k=len(plan.effect), unablated_accuracy=unablated,
        effect_accuracy=effect_acc, effect_drop=effect_drop, effect_drop_abs=effect_abs,
        random_accuracy_mean=rand_mean, random_accuracy_std=sample_std(rand),
        random_drop=random_drop, random_drop_abs=random_abs, unablated_prob=prob[0] if prob else nan,
        effect_prob=prob[effect] if prob else nan,
        random_prob_mean=statistics.fmean(prob[i] for i in randoms) if prob and randoms else nan,
        components=" ".join(c.name for c in plan.effect), note=target.note,
        effect_token_accuracy=per_token[effect] if per_token else nan,
        random_token_accuracy_mean=statistics.fmean(per_token[i] for i in randoms) if per_token and randoms else nan,
        replaced_in_sample=replaced,
    )


@torch.no_grad()
def transfer(handle: ModelHandle, cfg: TransferConfig, out_dir: str | Path, quiet: bool = False) -> TransferResult:
    """Knock out each source's key components on each target set and write the matrix."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    if any(out.resolve() == Path(s).resolve() for s in cfg.sources):
        raise ConfigError(f"output folder {str(out)!r} is a source run folder; write the transfer to its own folder")
    if (out / "metadata.json").is_file() and json.loads((out / "metadata.json").read_text()).get("stage") != "transfer":
        raise ConfigError(f"output folder {str(out)!r} holds another stage's run; write the transfer to its own folder")
    for name in cfg.targets:  # missing data fail now, not after an hour of other targets
        spec = target_set(name)
        if spec.kind == "word" and spec.source is not None:
            resolve_word_problems(spec.source, "test", cfg.data_dir)
    start = time.perf_counter()
    plans = plan_sources(handle, cfg)
    rows: list[TransferRow] = []
    targets_meta: dict[str, Any] = {}
    for name in tqdm(cfg.targets, desc="transfer", unit="target", disable=quiet):
        began = time.perf_counter()
        target = prepare_target(handle, name, cfg, [p.excluded for p in plans])
        rows += score_target(handle, target, plans, cfg)
        targets_meta[name] = {
            "description": target.spec.description, "prompts": target.n_total, "answered": target.n_answered,
            "used": target.n_prompts, "scored_rows": len(target.pair_index) if target.pair_index is not None else 0,
            "base_accuracy": defined(target.base_accuracy),
            "ablation": target.ablation, "ablation_groups": target.groups, "shared_prefix_tokens": target.prefix_len,
            "ablation_sources": target.ablation_info, "scored_prompts": target.prompts, "note": target.note,
            "held_out": target.held_out,
            "seconds": time.perf_counter() - began,
        }
        logger.info("%s: %d of %d prompts answered, %d used", name, target.n_answered, target.n_total,
                    targets_meta[name]["used"])
    metadata = {
        "stage": cfg.STAGE,
        "model": handle.source,
        "dims": asdict(handle.dims),
        "config": asdict(cfg),
        "seed": cfg.seed,
        "sources": [{"path": p.label, "source_set": p.source_set, "k": len(p.effect),
                     "components": [c.name for c in p.effect], "why": p.why} for p in plans],
        "identify_runs": [p.record for p in plans],
        "targets": targets_meta,
        "timings": {"transfer_s": time.perf_counter() - start},
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    result = TransferResult(rows, out, metadata)
    write_transfer_outputs(result, handle.source.get("model", "?"), cfg)
    return result


def transfer_csv(rows: list[TransferRow]) -> str:
    """One row per source x target; an undefined number (NaN in memory) is an empty cell."""
    table = [
        {c: cell(defined(v), ".6f") if isinstance(v, float) else v for c, v in asdict(row).items() if c in CSV_COLUMNS}
        for row in rows
    ]
    return csv_text(table, CSV_COLUMNS)


def read_transfer_csv(path: str | Path) -> list[TransferRow]:
    """The rows of a transfer.csv, typed again (for reports that only read artefacts); empty cells are NaN."""
    types = {f: t for f, t in TransferRow.__annotations__.items()}
    convert = {"int": int, "float": lambda v: float(v) if v else math.nan, "str": str}
    with Path(path).open() as handle:
        return [TransferRow(**{k: convert[types[k]](v) for k, v in row.items()}) for row in csv.DictReader(handle)]


def write_transfer_outputs(result: TransferResult, model: str, cfg: TransferConfig) -> None:
    """transfer.csv, transfer.png, then metadata.json (its presence means the folder is complete)."""
    from arithmech.report.transfer_plots import transfer_heatmap

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    atomic_write_text(out / "transfer.csv", transfer_csv(result.rows))
    sources, targets, effect = result.matrix("effect_drop")
    _, _, rand = result.matrix("random_drop")
    by_source = {r.source: r for r in result.rows}
    by_target = {r.target: r for r in result.rows}  # base accuracy and prompts are the same for every source
    labels = [f"{s}\n{by_source[s].source_set}, k={by_source[s].k}" for s in sources]
    columns = [f"{t}\nbase {by_target[t].base_accuracy:.0%}, n={by_target[t].n_prompts}" for t in targets]
    title = f"transfer: {cfg.ablation} ablation of each source's top-k, {model}"
    transfer_heatmap(labels, columns, effect, rand, out / "transfer.png", title)
    atomic_write_json(out / "metadata.json", result.metadata)
