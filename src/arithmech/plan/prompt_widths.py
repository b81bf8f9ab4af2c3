"""The widest prompt of a stage whose prompts are data, in its model's tokens, read before the weights load.

Why: a batch is padded to its widest prompt, so that prompt sets the peak. The plan assumes widths
(planner.PROMPT_TOKENS, DEFAULT_TOKENS) that hold for the project's templates, but fine-tuning's examples and
evaluate's benchmarks are data: on SmolLM2 the arithmetic examples run to 76 tokens (planned 48) and MMLU's 5-shot
prompts to about 3,150 (planned 256). A budget fitted at the assumption lets the stage break it. So the budget
(budget.py) tokenizes what these stages will tokenize, with the model's tokenizer, which loads without the weights:
    identify  its reference set's prompts before the answer check keeps some (data/reference_set.py): the default
              set's run from 26 to 70 tokens on SmolLM2, and the answer check pads them all to the widest
    finetune  its training examples (stages/finetune.training_data), kept at max_length
    evaluate  its benchmarks' rows (evaluate/widths.py); lm-eval's tasks batch themselves and are not read
The other stages keep the plan's width: their prompts are an identify run's, which `run` has not made yet when it
fits them, or are chosen by the model (circuit).
"""

from __future__ import annotations

from typing import Any

STAGES = ("identify", "finetune", "evaluate")


def widest_prompt(stage: str, cfg: Any, tokenizer: Any) -> int | None:
    """The widest prompt, in tokens, `cfg`'s stage will run; None where its prompts are not data (module docstring)."""
    if stage == "identify":
        from arithmech.data import tokenize_pairs
        from arithmech.data.reference_set import reference_pairs

        tokenized, _ = tokenize_pairs(tokenizer, reference_pairs(cfg), answer_digits=cfg.answer_digits)
        return int(tokenized.ref_ids.shape[1])
    if stage == "finetune":
        from arithmech.stages.finetune import training_data

        data, _ = training_data(tokenizer, cfg, cfg.max_length)
        return max(len(example.input_ids) for example in data)
    if stage == "evaluate" and cfg.benchmarks:
        from arithmech.evaluate.widths import widest_row

        options = cfg.options()
        return max(widest_row(name, options, tokenizer) for name in cfg.benchmarks)
    return None
