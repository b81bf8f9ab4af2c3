"""The circuit stage's prompt pairs: find pairs to score edges on, disjoint test pairs to evaluate circuits on.

MIB finds a circuit on one split and measures its faithfulness on another (MIB-circuit-track: run_attribution.py
scores edges on `train`, run_evaluation.py evaluates on `validation` by default), so CPR and CMD say how a circuit
generalises. The stage does the same by default:
    built-in prompts    the find part and the test part of `data/mib_arithmetic.py`: every fact (an addition
                        triple's operands {x, y}, read as x + y, y + x, z - x or z - y) belongs to one part by a
                        seeded hash, and pairs are made within a part, so no prompt and no fact is shared;
    --mib-dataset       find on --mib-split (train), evaluate on --mib-eval-split (validation) of the same data,
                        or on --mib-eval-dataset's rows; evaluation rows that share a prompt (clean or
                        counterfactual) with any find row are dropped and counted;
    --from              the find and test pairs the folder stored (prompts.jsonl, test_prompts.jsonl);
    --circuit-file      test pairs only (the file's circuit was found elsewhere);
    --in-sample         no test pairs: the circuits are evaluated on the find pairs, and every table says so.
Both parts pass the answer filter (`circuits/prompts.py`), each with its own counts; fewer than `min_prompts`
surviving in either is refused before any edge is scored.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from arithmech.circuits.prompts import PROMPTS_PER_PAIR, FilterCounts, answered_pairs, filter_answered
from arithmech.data.io import read_prompt_file
from arithmech.data.mib_arithmetic import mib_pairs
from arithmech.data.mib_dataset import apart_from, mib_dataset_pairs, read_mib_rows
from arithmech.data.mib_facts import distinct_prompts
from arithmech.data.prompts import PromptPair
from arithmech.errors import ConfigError, DataError
from arithmech.models.load import ModelHandle
from arithmech.progress import progress_bar
from arithmech.stages.circuit_config import TEST_PROMPTS_FILE, CircuitConfig

logger = logging.getLogger(__name__)

HELD_OUT, IN_SAMPLE = "held-out", "in-sample"
"""What the `pairs` column of every table says: evaluated on the test pairs, or on the pairs the edges were
scored on."""


@dataclass(frozen=True)
class PromptSplit:
    """The find pairs (edges are scored on them), the test pairs (circuits are evaluated on them) and what the
    answer filter saw on each."""

    find: list[PromptPair]
    """Empty for --circuit-file (nothing is scored here)."""
    test: list[PromptPair] | None
    """None when there are none: --in-sample, or a --from folder that stored none."""
    in_sample: bool
    filtered: dict[str, list[FilterCounts]] | None = None
    """"find" / "test" -> the answer filter's counts per source (None: read back, or kept unfiltered)."""
    shared: int = 0
    """Evaluation rows dropped because a prompt of theirs is a find prompt (MIB data only)."""
    described: tuple[str, str] = ("", "")
    """Where the find and the test pairs come from, in words."""

    @property
    def evaluated(self) -> list[PromptPair] | None:
        """The pairs the circuits are evaluated on."""
        return self.find if self.in_sample else self.test

    @property
    def label(self) -> str:
        return IN_SAMPLE if self.in_sample else HELD_OUT

    def record(self) -> dict[str, Any]:
        """metadata.json's "evaluation": which pairs the sweep ran on, and where each set came from."""
        return {"pairs": self.label, "find": self.described[0], "test": self.described[1],
                "shared_rows_dropped": self.shared}  # fmt: skip


def prompt_split(handle: ModelHandle, cfg: CircuitConfig, quiet: bool = True) -> PromptSplit:
    """New find and test pairs (the find pairs only under `in_sample`, the test pairs only for `circuit_file`)."""
    if cfg.mib_dataset is not None:
        return _dataset_split(handle, cfg, quiet)
    parts: dict[str, tuple[list[PromptPair], list[FilterCounts] | None]] = {}
    if cfg.circuit_file is None:
        parts["find"] = _built_in(handle, cfg, None if cfg.in_sample else "find", cfg.n_prompts, quiet)
    if not cfg.in_sample:
        parts["test"] = _built_in(handle, cfg, "test", cfg.n_test, quiet)
    rule = f"facts split by seed {cfg.seed} (data/mib_arithmetic.py)"
    described = (f"built-in MIB prompts, {'every fact' if cfg.in_sample else 'find part: ' + rule}",
                 "" if cfg.in_sample else f"built-in MIB prompts, test part: {rule}")  # fmt: skip
    return _split(parts, cfg, 0, described)


def widest_prompt(tokenizer: Any, cfg: CircuitConfig) -> int:
    """The widest prompt the stage will score, in tokens, read before the model loads (plan/prompt_widths.py): a
    --from folder's stored pairs, a dataset's rows of its operations, or the widest built-in prompt of each."""
    from arithmech.circuits.prompts import circuit_batch
    from arithmech.data.mib_arithmetic import widest_prompt_tokens

    edges = cfg.edges_file()
    if cfg.circuit_file is None and edges is not None:
        split = stored_split(edges.parent, cfg, {})
        pairs = [*split.find, *(split.test or [])]
    elif cfg.mib_dataset is not None:
        rows = read_mib_rows(cfg.mib_dataset, cfg.mib_split)
        if not cfg.in_sample:
            rows += read_mib_rows(cfg.mib_eval_dataset or cfg.mib_dataset, cfg.mib_eval_split)
        pairs = [pair for op in cfg.operations for pair in mib_dataset_pairs(tokenizer, rows, op)[0]]
    else:
        return max(widest_prompt_tokens(tokenizer, op, cfg.max_operand) for op in cfg.operations)
    return int(circuit_batch(tokenizer, pairs).clean_ids.shape[1])


def stored_split(folder: Path, cfg: CircuitConfig, recorded: dict[str, Any]) -> PromptSplit:
    """The pairs a circuit folder stored: prompts.jsonl (find) and test_prompts.jsonl (test, when there); where each
    set came from as the folder recorded it (`recorded`, its metadata.json's "evaluation")."""
    test_path = folder / TEST_PROMPTS_FILE
    test = read_prompt_file(test_path) if test_path.is_file() else None
    if test is None and cfg.evaluate and not cfg.in_sample:  # as CircuitConfig.check_files refuses it up front
        raise ConfigError(f"--from {str(folder)!r} holds no held-out pairs ({TEST_PROMPTS_FILE}); score it anew, or "
                          "pass --in-sample to evaluate on the pairs its edges were scored on")  # fmt: skip
    origin = [f"{recorded[part]}, " if recorded.get(part) else "" for part in ("find", "test")]
    described = (f"{origin[0]}read back from {folder / 'prompts.jsonl'}",
                 f"{origin[1]}read back from {test_path}" if test else "")  # fmt: skip
    shared = int(recorded.get("shared_rows_dropped") or 0)
    return PromptSplit(read_prompt_file(folder / "prompts.jsonl"), test, cfg.in_sample, None, shared, described)


def _split(
    parts: dict[str, tuple[list[PromptPair], list[FilterCounts] | None]], cfg: CircuitConfig, shared: int,
    described: tuple[str, str],
) -> PromptSplit:  # fmt: skip
    filtered = None if cfg.keep_incorrect else {part: counts or [] for part, (_, counts) in parts.items()}
    find, _ = parts.get("find", ([], None))
    test = parts["test"][0] if "test" in parts else None
    return PromptSplit(find, test, cfg.in_sample, filtered, shared, described)


def _built_in(
    handle: ModelHandle, cfg: CircuitConfig, part: str | None, n: int, quiet: bool = True
) -> tuple[list[PromptPair], list[FilterCounts] | None]:
    """n built-in pairs of `part` (None: every fact) from the operations in turn, through the answer filter."""
    quota = math.ceil(n / len(cfg.operations))
    if cfg.keep_incorrect:
        pairs = [p for op in cfg.operations for p in mib_pairs(handle.tokenizer, op, quota, cfg.seed, cfg.max_operand,
                                                             part=part)]  # fmt: skip
        return pairs[:n], None
    kept: list[PromptPair] = []
    counts: list[FilterCounts] = []
    for operation in cfg.operations:
        held = distinct_prompts(operation, cfg.max_operand, cfg.seed, part)
        logger.info("%s pairs (%s): %d wanted, from %s different prompts with operands 0..%d; the answer check draws "
                    "at most %s of them (SmolLM2-135M answers about 1 prompt in 10)", operation, part or "find", quota,
                    f"{held:,}", cfg.max_operand, f"{PROMPTS_PER_PAIR * quota:,}")  # fmt: skip
        with progress_bar(f"checking answers ({part or 'find'}, {operation})", "prompt", quiet) as bar:
            pairs, seen = answered_pairs(handle.view, handle.tokenizer, operation, quota, cfg.seed, cfg.max_operand,
                                         cfg.batch_size, part=part, progress=bar)  # fmt: skip
        logger.info("answer filter (%s): %s", part or "find", seen.describe())
        kept, counts = kept + pairs, [*counts, seen]
    check_enough(len(kept), counts, n, cfg, "test" if part == "test" else "find")
    return kept[:n], counts


def _dataset_split(handle: ModelHandle, cfg: CircuitConfig, quiet: bool = True) -> PromptSplit:
    """Find pairs from --mib-split's rows, test pairs from the evaluation rows not sharing a prompt with them."""
    assert cfg.mib_dataset is not None
    find_rows = read_mib_rows(cfg.mib_dataset, cfg.mib_split)
    parts: dict[str, tuple[list[PromptPair], list[FilterCounts] | None]] = {}
    if cfg.circuit_file is None:
        parts["find"], _ = _dataset_part(handle, cfg, find_rows, None, cfg.n_prompts, "find", quiet)
    shared = 0
    eval_source = cfg.mib_eval_dataset or cfg.mib_dataset
    if not cfg.in_sample:
        test_rows = read_mib_rows(eval_source, cfg.mib_eval_split)
        parts["test"], shared = _dataset_part(handle, cfg, test_rows, find_rows, cfg.n_test, "test", quiet)
    described = (f"{cfg.mib_dataset}, split {cfg.mib_split}",
                 "" if cfg.in_sample else f"{eval_source}, split {cfg.mib_eval_split}")  # fmt: skip
    return _split(parts, cfg, shared, described)


def _dataset_part(
    handle: ModelHandle,
    cfg: CircuitConfig,
    rows: list[dict[str, Any]],
    find_rows: list[dict[str, Any]] | None,
    n: int,
    part: str,
    quiet: bool = True,
) -> tuple[tuple[list[PromptPair], list[FilterCounts] | None], int]:
    """n pairs of a dataset's rows of each operation (those sharing a prompt with `find_rows` dropped), through
    the answer filter; and how many rows were dropped as shared."""
    quota = math.ceil(n / len(cfg.operations))
    kept: list[PromptPair] = []
    counts: list[FilterCounts] = []
    dropped = 0
    for operation in cfg.operations:
        mine, shared = (rows, 0) if find_rows is None else apart_from(rows, find_rows, operation)
        pairs, unusable = mib_dataset_pairs(handle.tokenizer, mine, operation)
        dropped += shared
        if not pairs and not unusable.count and not shared:
            raise DataError(
                f"--mib-dataset {cfg.mib_dataset!r} has no {operation} rows (column operator) in its {part} split; "
                "choose the operation its rows hold with --operations"
            )
        source = f"{cfg.mib_dataset} ({operation})"
        if cfg.keep_incorrect:
            if not pairs and unusable.count:
                raise unscorable(part, f"{source}: {unusable.count} rows unusable: {unusable.describe()}")
            kept += pairs[:quota]
            continue
        with progress_bar(f"checking answers ({part}, {operation})", "pair", quiet) as bar:
            passed, seen = filter_answered(handle.view, handle.tokenizer, pairs, source, cfg.batch_size, want=quota,
                                           progress=bar)  # fmt: skip
        seen = replace(seen, unusable=unusable.count, unusable_why=unusable.describe(), shared=shared)
        logger.info("answer filter (%s): %s", part, seen.describe())
        kept, counts = kept + passed, [*counts, seen]
    if not cfg.keep_incorrect:
        check_enough(len(kept), counts, n, cfg, part)
    return (kept[:n], None if cfg.keep_incorrect else counts), dropped


def check_enough(kept: int, counts: list[FilterCounts], n: int, cfg: CircuitConfig, part: str) -> None:
    """A DataError when fewer `part` pairs than `min_prompts` (at most n) survive the answer filter; its advice
    fits where the pairs came from (a dataset's rows are the user's to fix, operands are not theirs to choose)."""
    need = min(cfg.min_prompts, n)
    if kept >= need:
        return
    seen = "; ".join(c.describe() for c in counts)
    fewer = ", fewer --test-prompts" if part == "test" else ""
    rule = ("(the model's top token must be the scored answer on the clean prompt and the counterfactual answer on "
            "the counterfactual prompt)")  # fmt: skip
    if cfg.mib_dataset is None:
        raise DataError(f"only {kept} {part} pairs survive the answer filter {rule}, fewer than {need} ({seen}): "
                        f"try smaller operands (e.g. --max-operand 20, whose parts hold at least 50 pairs of each "
                        f"operation), other prompts, a lower --min-prompts{fewer}, or another model")  # fmt: skip
    if any(c.unusable for c in counts) and not any(c.pairs for c in counts):
        raise unscorable(part, "; ".join(f"{c.source}: {c.unusable} rows unusable: {c.unusable_why}"
                                         for c in counts if c.unusable))  # fmt: skip
    raise DataError(f"only {kept} {part} pairs of --mib-dataset survive the answer filter {rule}, fewer than {need} "
                    f"({seen}): give more rows, fix the unusable ones, a lower --min-prompts{fewer}, or another "
                    "model")  # fmt: skip


def unscorable(part: str, why: str) -> DataError:
    """No row of a dataset's `part` can be scored, and why (the reasons with their first rows)."""
    return DataError(f"no {part} row of --mib-dataset can be scored ({why}); fix those rows, or give MIB's own "
                     "arithmetic data")  # fmt: skip
