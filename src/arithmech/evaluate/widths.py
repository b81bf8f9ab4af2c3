"""The widest token row a benchmark's forward passes hold, read with the tokenizer before the weights load.

Why: a batch is padded to its widest row, so the widest row sets evaluate's peak, and benchmark prompts are data:
the default math benchmarks' 8-shot prompts run to about 920 tokens on SmolLM2 and MMLU's 5-shot ones to about
3,150, where the plan's default assumes 256 (plan/planner.PROMPT_TOKENS). The memory budget plans at this width
instead (plan/budget.py), from the same rows, subset and prompts `runner.evaluate_benchmark` builds.

Widths (what each kind's model calls embed; generated tokens are the plan's own term)
    generate    the prompt's tokens (generation.generate_greedy encodes each prompt alone)
    choice      the context's tokens plus its longest option's, plus BOUNDARY_TOKENS: choice.py tokenizes each
                context + option whole, and a merge across the boundary can cost a token. Tokenizing every
                option after every context, as scoring does, takes minutes on MMLU; this takes seconds.
    general     the text's tokens, at most general_max_tokens (general.py truncates there)
    arithmetic  the prompt and its answer, tokenized whole (arithmetic.score_answers)
None for a name the plan cannot read before loading (none here: lm-eval's tasks are not benchmarks).
"""

from __future__ import annotations

from typing import Any

from arithmech.data.arithmetic_split import make_split
from arithmech.data.locate import is_jsonl_path
from arithmech.evaluate.arithmetic import arithmetic_prompts, scored_subset
from arithmech.evaluate.benchmarks import benchmark, build_prompts, resolve_shots
from arithmech.evaluate.general_texts import load_general_texts
from arithmech.evaluate.loading import load_rows
from arithmech.evaluate.runner import EvalOptions, load_items, select_subset

BOUNDARY_TOKENS = 2
"""Tokens a context and an option tokenized whole may take beyond the two apart (a merge across the boundary)."""
SPECIAL_TOKENS = 4
"""Tokens a text may have beyond its UTF-8 bytes: BOS, EOS, SentencePiece's leading "▁", and one to spare."""
CHUNK = 256
"""Texts tokenized in one call."""


def widest_row(name: str, options: EvalOptions, tokenizer: Any) -> int:
    """The widest row, in tokens, of benchmark `name`'s forward passes under `options` (module docstring)."""
    bench = benchmark(name, load_rows(name).rows[:1] if is_jsonl_path(name) else None)
    if bench.kind == "general":
        texts = select_subset(load_general_texts(options.general_text), options.limit, options.seed, bench.name)
        return min(options.general_max_tokens, _widest(tokenizer, [t.text for t in texts], True))
    if bench.kind == "arithmetic":
        assert bench.arithmetic is not None
        shots = resolve_shots(bench, options.n_shot)
        prompts = arithmetic_prompts(make_split(options.split_seed), bench.arithmetic, bench.operations,
                                     options.arithmetic_part, shots)  # fmt: skip
        return _widest(tokenizer, [p.reference + p.answer for p in scored_subset(prompts, options.limit,
                                                                                  options.seed)], True)  # fmt: skip
    items, exemplars, _ = load_items(bench, options)
    chat = tokenizer if options.chat_template else None
    prompts = build_prompts(bench, items, options.n_shot, options.choice_format, exemplars, chat)
    texts, special = [p.text for p in prompts], not options.chat_template
    if bench.kind == "generate":
        return _widest(tokenizer, texts, special)
    conts = sorted({c for p in prompts for c in p.continuations})
    lengths = dict(zip(conts, map(len, tokenizer(conts, add_special_tokens=False)["input_ids"]), strict=True))
    return _widest(tokenizer, texts, special, [max(lengths[c] for c in p.continuations) + BOUNDARY_TOKENS
                                               for p in prompts])  # fmt: skip


def _widest(tokenizer: Any, texts: list[str], special: bool, extra: list[int] | None = None) -> int:
    """The most tokens of a text, plus its `extra`: the longest texts are tokenized first, a chunk at a time, up to
    where no text left can be wider (tokens are at most a text's UTF-8 bytes plus SPECIAL_TOKENS). On a one-token-
    a-byte tokenizer that is one chunk; on MMLU's 14,000 prompts and a BPE one, about half of them."""
    extra = extra or [0] * len(texts)
    bounds = [len(text.encode()) + SPECIAL_TOKENS + more for text, more in zip(texts, extra, strict=True)]
    order = sorted(range(len(texts)), key=lambda i: -bounds[i])
    best = 0
    for start in range(0, len(order), CHUNK):
        chunk = order[start : start + CHUNK]
        if bounds[chunk[0]] <= best:
            break
        ids = tokenizer([texts[i] for i in chunk], add_special_tokens=special)["input_ids"]
        best = max(best, *(len(row) + extra[i] for row, i in zip(ids, chunk, strict=True)))
    return best
