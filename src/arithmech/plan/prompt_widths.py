"""The widest prompt of a stage whose prompts are data, in its model's tokens, read before the weights load.

Why: a batch is padded to its widest prompt, so that prompt sets the peak. The plan assumes widths
(planner.PROMPT_TOKENS, DEFAULT_TOKENS) that hold for the project's templates, but fine-tuning's examples and
evaluate's benchmarks are data: on SmolLM2 the arithmetic examples run to 76 tokens (planned 48) and MMLU's 5-shot
prompts to about 3,150 (planned 256). A budget fitted at the assumption lets the stage break it. So the budget
(budget.py) tokenizes what these stages will tokenize, with the model's tokenizer, which loads without the weights:
    finetune  its training examples (stages/finetune.training_data), kept at max_length
    evaluate  its benchmarks' rows (evaluate/widths.py); lm-eval's tasks batch themselves and are not read
Other stages' prompts are the project's templates, or are chosen by the model (circuit), and keep the plan's width.
"""

from __future__ import annotations

from typing import Any

STAGES = ("finetune", "evaluate")


def widest_prompt(stage: str, cfg: Any, tokenizer: Any) -> int | None:
    """The widest prompt, in tokens, `cfg`'s stage will run; None where its prompts are not data (module docstring)."""
    if stage == "finetune":
        from arithmech.stages.finetune import training_data

        data, _ = training_data(tokenizer, cfg, cfg.max_length)
        return max(len(example.input_ids) for example in data)
    if stage == "evaluate" and cfg.benchmarks:
        from arithmech.evaluate.widths import widest_row

        options = cfg.options()
        return max(widest_row(name, options, tokenizer) for name in cfg.benchmarks)
    return None
