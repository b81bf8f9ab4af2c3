"""Arithmetic fine-tuning data: the train part of the leakage-free split, as few-shot prompts with their answers.

Background
    To show that training the key heads improves the skill they were found for, the model is trained on that
    skill: arithmetic prompts of the project's templates (data/arithmetic_split.py, train templates x train
    operand pairs), and tested on held-out templates and pairs (`arithmech evaluate --benchmarks arithmetic`).
    Zhang et al. (2024) train on math word problems instead; at 135M parameters those stay out of reach, while
    arithmetic is where the default model is weak but not helpless.

Examples
    prompt  a train prompt exactly as the benchmark asks it: `few_shot` solved examples of the same template
            (train pairs), each ended by a newline, then the query, e.g. "7 - 2 = 5\\n9 - 4 = 5\\n3 - 1 = 2\\n8 - 3 = "
    target  the answer and the newline that ends every solved example ("5\\n"), so the model also learns to end
            the number (what the benchmark's exact match checks)
    The boundary is the tokenizer's own (data/tokens.continuation_span, as the benchmark scores it): where the
    prompt's last token merges with the answer, the merged token is the first target. No chat template: the
    benchmark's prompts are plain few-shot text. `n` prompts cycle over every (train template, train pair) with
    new solved examples each pass (None: each once); examples longer than `max_length` tokens are dropped.

Usage
    >>> data, record = arithmetic_examples(handle.tokenizer, ("subtraction",), n=256, split_seed=0, seed=0)
"""

from __future__ import annotations

from typing import Any

from arithmech.data.arithmetic_split import DEFAULT_SHOTS, make_split, split_prompts
from arithmech.data.tokens import continuation_span
from arithmech.errors import DataError
from arithmech.finetune.data import TokenizedExample
from arithmech.finetune.sft_rows import ARITHMETIC

"""The name of this training set in `--data`."""


def arithmetic_examples(
    tokenizer: Any,
    operations: tuple[str, ...],
    n: int | None,
    split_seed: int,
    seed: int,
    max_length: int = 512,
    few_shot: int = DEFAULT_SHOTS,
) -> tuple[list[TokenizedExample], dict[str, Any]]:
    """Tokenized train prompts and their record (counts, the split's fingerprint and its whole record)."""
    split = make_split(split_seed)
    prompts = split_prompts(split, "train", operations, n=n, few_shot=few_shot, seed=seed)
    out = []
    for i, p in enumerate(prompts):
        whole, start = continuation_span(tokenizer, p.reference, p.answer + "\n")
        if len(whole) <= max_length:
            out.append(TokenizedExample(f"{i:05d}-{p.template_id}-{p.a}-{p.b}", tuple(whole), start))
    if not out:
        raise DataError(f"every arithmetic example is longer than max_length {max_length} tokens; raise --max-length")
    problems = {(p.template_id, p.a, p.b) for p in prompts}
    record = {"path": ARITHMETIC, "operations": list(operations), "rows": len(prompts), "kept": len(out),
              "tokenized": len(out), "too_long": len(prompts) - len(out), "distinct_problems": len(problems),
              "few_shot": few_shot, "format": "arithmetic few-shot", "split_seed": split_seed,
              "split_fingerprint": split.fingerprint, "split": split.record()}  # fmt: skip
    return out, record
