"""The widest prompt of a stage whose prompts are data, in its model's tokens, read before the weights load.

Why: a batch is padded to its widest prompt, so that prompt sets the peak. The plan assumes widths
(planner.PROMPT_TOKENS, DEFAULT_TOKENS) that hold for the project's templates, but fine-tuning's examples and
evaluate's benchmarks are data: on SmolLM2 the arithmetic examples run to 76 tokens (planned 48) and MMLU's 5-shot
prompts to about 3,150 (planned 256). A budget fitted at the assumption lets the stage break it. So the budget
(budget.py) tokenizes what these stages will tokenize, with the model's tokenizer, which loads without the weights:
    identify   its reference set's prompts before the answer check keeps some (data/reference_set.py), each with
               its answer as the check runs it: the default set's run from 26 to 70 tokens on SmolLM2, and a batch
               is padded to its widest
    knockout   the ranked prompts of its identify run and the held-out candidates (data/heldout.py step 1), or,
               without --from, its own reference set
    attention, mlp, fourier, agreement
               the ranked prompts of their identify run (its prompts.jsonl)
    transfer   its targets' prompts, held out from its sources' ranked prompts (stages/transfer_targets.py step 1)
    mediation  its pairs of every task (stages/mediate.mediation_items)
    neurons    its reference set of every operation, as identify's
    heuristics its operand grid of every operation (stages/heuristics.operation_grid)
    numbers    its value grid, each prompt with its answer (stages/numbers.value_grid)
    circuit    a --from folder's pairs, a MIB dataset's rows, or the widest built-in prompt (its operands the
               numbers in range written in the most tokens; the answer filter draws the rest)
    finetune   its training examples (stages/finetune.training_data), kept at max_length
    evaluate   its benchmarks' rows (evaluate/widths.py); lm-eval's tasks batch themselves and are not read
An identify run is read from its folder, or, in `arithmech run` before identify has made it, bounded by the
settings that will (`IdentifySource`): its reference set before the answer check holds every prompt it will keep;
the held-out candidates are then those of no ranked fact, generated alike (`run` fits again once the folder is
there). `arithmech plan` reads with the same `WidthReader` where the model's tokenizer is on this machine; the
plan's assumed widths are left to a model with none here (a preset, a config.json) and to a tokenizer that cannot
be read.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.errors import ArithmechError

logger = logging.getLogger(__name__)

STAGES = ("identify", "knockout", "attention", "mlp", "fourier", "agreement", "transfer", "mediation", "neurons",
          "heuristics", "numbers", "circuit", "finetune", "evaluate")
MAKES_ITS_OWN = ("mediation", "neurons", "heuristics", "numbers")
"""The stages that make their prompts from templates, by their own code."""
READS_IDENTIFY = ("knockout", "attention", "mlp", "fourier", "agreement", "transfer")
"""The stages whose prompts are an identify run's, or are held out from them."""

IdentifySource = str | Path | ReferenceSetConfig
"""An identify run's folder, or the settings of the identify stage that will make it."""


@dataclass(frozen=True)
class WidthReader:
    """Reads the widest prompt of stages with a model's tokenizer, capped at its context, and remembers each (reading
    MMLU's takes seconds); what the memory budget and `arithmech plan` plan at."""

    tokenizer: Callable[[], Any]
    """Gives the tokenizer (loaded on first use: it is not needed where nothing is read)."""
    context: int | None = None
    """The model's positions: a stage truncates or drops a wider prompt."""
    widths: dict[str, int | None] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def widest(self, stage: str, cfg: Any, identify: IdentifySource | None = None,
               ignored: Collection[str] = ()) -> int | None:  # fmt: skip
        """`widest_prompt`, logged, or None (the plan's assumed width) where the prompts cannot be read before the
        model loads (a warning says why); `ignored`: settings that do not change the prompts (batch sizes)."""
        if stage not in STAGES:
            return None
        fields = [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name not in ignored]
        key = repr([stage, fields, identify])
        if key not in self.widths:
            logger.info("%s: reading its widest prompt with the tokenizer, to plan its memory", stage)
            from arithmech import preflight

            try:
                with preflight.logs_held_back("arithmech", "transformers"):  # the stage reads and warns next
                    widest = widest_prompt(stage, cfg, self.tokenizer(), identify)
            except (OSError, ValueError, ArithmechError) as err:  # no tokenizer here, or prompts the stage refuses
                logger.warning("%s: its widest prompt cannot be read before the model loads (%s); its memory is "
                               "planned at the plan's assumed width", stage, str(err).splitlines()[0])  # fmt: skip
                widest = None
            if widest is not None:
                logger.info("%s: its widest prompt has %d tokens", stage, widest)
                widest = min(widest, self.context or widest)
            self.widths[key] = widest
        return self.widths[key]


def widest_prompt(stage: str, cfg: Any, tokenizer: Any, identify: IdentifySource | None = None) -> int | None:
    """The widest prompt, in tokens, `cfg`'s stage will run; None where its prompts are not data (module docstring).
    `identify`: the run a stage reads, where its config does not name it (attention, mlp, fourier; `run`)."""
    if stage == "identify":
        return _reference_width(cfg, tokenizer)
    if stage in READS_IDENTIFY:
        return _reads_identify(stage, cfg, tokenizer, identify)
    if stage in MAKES_ITS_OWN:
        return _own_prompts(stage, cfg, tokenizer)
    if stage == "circuit":
        from arithmech.stages.circuit_prompts import widest_prompt as widest_circuit_prompt

        return widest_circuit_prompt(tokenizer, cfg)
    if stage == "finetune":
        from arithmech.stages.finetune import training_data

        data, _ = training_data(tokenizer, cfg, cfg.max_length)
        return max(len(example.input_ids) for example in data)
    if stage == "evaluate" and cfg.benchmarks:
        from arithmech.evaluate.widths import widest_row

        options = cfg.options()
        return max(widest_row(name, options, tokenizer) for name in cfg.benchmarks)
    return None


def _own_prompts(stage: str, cfg: Any, tokenizer: Any) -> int:
    """The widest prompt of a stage that makes its prompts from templates (the table above), by its own code."""
    if stage == "mediation":
        from arithmech.stages.mediate import mediation_items

        return max(len(item.base_ids) for task in cfg.tasks for item in mediation_items(tokenizer, cfg, task)[0])
    if stage == "neurons":
        return max(_reference_width(cfg.reference_settings(op), tokenizer) for op in cfg.operations)
    if stage == "heuristics":
        from arithmech.stages.heuristics import grid_numbers, operation_grid

        numbers = grid_numbers(tokenizer, cfg)
        return max(int(operation_grid(tokenizer, cfg, op, numbers)[1].ref_ids.shape[1]) for op in cfg.operations)
    from arithmech.stages.numbers import grid_width, value_grid

    return grid_width(value_grid(tokenizer, cfg)[2])


def _reference_width(cfg: ReferenceSetConfig, tokenizer: Any) -> int:
    """A reference set's widest prompt as its answer check runs it, before the check keeps some."""
    from arithmech.data.reference_set import reference_pairs

    return _width(tokenizer, reference_pairs(cfg), cfg.answer_digits, checked=True)


def _reads_identify(stage: str, cfg: Any, tokenizer: Any, identify: IdentifySource | None) -> int | None:
    """The widest prompt of a stage that reads an identify run (STAGES' table)."""
    from arithmech.data.heldout import Exclusion, fresh_candidates

    if stage == "knockout" and identify is None and not cfg.from_run:  # its own reference set
        return _reference_width(ReferenceSetConfig(max_prompts=cfg.max_prompts, seed=cfg.seed,
                                                   answer_digits=cfg.answer_digits), tokenizer)  # fmt: skip
    named = cfg.sources if stage == "transfer" else [getattr(cfg, "from_run", None)]
    sources = [identify] if identify is not None else [source for source in named if source]
    if not sources:  # an analysis given no run folder here (it takes one beside its config)
        return None
    runs = [_ranked(source) for source in sources]
    if stage == "transfer":
        from arithmech.stages.transfer_targets import target_width

        excluded = [Exclusion.of(pairs) for pairs, _ in runs]
        return max(target_width(tokenizer, name, cfg, excluded) for name in cfg.targets)
    pairs, settings = runs[0]
    digits = settings.answer_digits or bool(getattr(cfg, "answer_digits", False))
    widest = _width(tokenizer, pairs, digits)
    if stage == "knockout" and cfg.held_out:
        held, _ = fresh_candidates(settings, pairs)
        widest = max(widest, _width(tokenizer, held, digits, checked=True)) if held else widest
    return widest


def _ranked(source: IdentifySource) -> tuple[list[Any], ReferenceSetConfig]:
    """(the prompts an identify run ranked on, or a bound on them, and its reference-set settings) of `source`."""
    if isinstance(source, ReferenceSetConfig):
        from arithmech.data.reference_set import reference_pairs

        return reference_pairs(source), source
    from arithmech.data import read_prompt_file
    from arithmech.data.heldout import reference_config
    from arithmech.lineage import identify_folder, read_metadata

    folder = identify_folder(source)
    config = (read_metadata(folder) or {}).get("config", {})
    return read_prompt_file(folder / "prompts.jsonl"), reference_config(config)


def _width(tokenizer: Any, pairs: list[Any], answer_digits: bool, checked: bool = False) -> int:
    """The padded width of `pairs` tokenized as the stages tokenize them (one row per answer token with digits);
    `checked`: of their answer check too, which runs each prompt followed by its whole answer."""
    from arithmech.data import tokenize_pairs
    from arithmech.data.reference_set import answer_sequences

    tokenized, _ = tokenize_pairs(tokenizer, pairs, answer_digits=answer_digits)
    checks = answer_sequences(tokenized)[0] if checked else []
    return max([int(tokenized.ref_ids.shape[1]), *map(len, checks)])

