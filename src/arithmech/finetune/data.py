"""Supervised fine-tuning data: math word problems as prompt + target, loss on the target only.

Background
    Zhang et al. (2024, sec. 5.3) fine-tune on the union of the math training sets, i.e. the LLM-Adapters math
    split (Hu et al. 2023: GSM8K, SVAMP, AddSub, SingleEq, MultiArith, AQuA; 3,260 rows, whose targets are
    ChatGPT rationales ending "The answer is N."). The default here is that file, `llm_adapters_math_v1/train`.

Rows and targets
    The examples of a training set, known name or JSONL file, are read by `sft_rows.py` (without torch, so the
    CLI checks a user's file before a model loads); this module tokenizes and batches them.

Prompt format
    With a chat template (and `chat_template=True`): the question is the user turn, the prompt is the template up to
    the assistant's turn, and the target is the rest of the rendered conversation (the answer and the template's
    end-of-turn tokens). Otherwise "Question: {q}\\nAnswer: " and the target followed by EOS (the format of
    the word-problem target sets). Prompt and target are tokenized apart, so the boundary is exact; labels are -100
    on the prompt. Examples longer than `max_length` are dropped (truncating a target would teach a wrong one).

Batches (`BatchPlan`)
    Every epoch is a seeded permutation of the examples cut into global batches of `batch_size`; a final partial
    batch is dropped so every optimizer step sees exactly `batch_size` examples (the permutation changes every
    epoch, so different rows are left out). Step s's examples depend only on (seed, s): this is what makes a
    resumed run, and a run over any number of processes, see the same data as one uninterrupted process.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from arithmech.errors import ConfigError, DataError
from arithmech.finetune.sft_rows import SFTExample

PLAIN_PROMPT = "Question: {question}\nAnswer: "


@dataclass(frozen=True)
class TokenizedExample:
    id: str
    input_ids: tuple[int, ...]
    n_prompt: int
    """Tokens of the prompt; the loss covers input_ids[n_prompt:]."""

    @property
    def n_target(self) -> int:
        return len(self.input_ids) - self.n_prompt


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def tokenize_examples(
    tokenizer: Any, examples: list[SFTExample], max_length: int, chat_template: bool = True
) -> tuple[list[TokenizedExample], dict[str, Any]]:
    """Token ids with the prompt/target boundary; counts {tokenized, too_long, format}."""
    use_chat = chat_template and has_chat_template(tokenizer)
    prompts, targets = [], []
    for ex in examples:
        prompt, target = _render(tokenizer, ex, use_chat)
        prompts.append(prompt)
        targets.append(target)
    prompt_ids = tokenizer(prompts, add_special_tokens=not use_chat)["input_ids"]
    target_ids = tokenizer(targets, add_special_tokens=False)["input_ids"]
    eos = getattr(tokenizer, "eos_token_id", None)
    out, too_long = [], 0
    for ex, p, t in zip(examples, prompt_ids, target_ids, strict=True):
        t = list(t) + ([eos] if (not use_chat and isinstance(eos, int)) else [])
        if len(p) + len(t) > max_length or not p or not t:
            too_long += 1
            continue
        out.append(TokenizedExample(ex.id, tuple(p) + tuple(t), len(p)))
    if not out:
        raise DataError(f"every example is longer than max_length {max_length} tokens; raise --max-length")
    return out, {"tokenized": len(out), "too_long": too_long, "format": "chat" if use_chat else "plain"}


def _render(tokenizer: Any, ex: SFTExample, use_chat: bool) -> tuple[str, str]:
    if not use_chat:
        return PLAIN_PROMPT.format(question=ex.question), ex.target
    user = [{"role": "user", "content": ex.question}]
    prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": ex.target}], tokenize=False)
    if not full.startswith(prompt):  # a template that renders the last turn differently: keep the answer only
        eos = getattr(tokenizer, "eos_token", None) or ""
        return prompt, ex.target + eos
    return prompt, full[len(prompt) :]


def collate(
    examples: list[TokenizedExample], pad_id: int, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Right-padded input_ids, attention_mask and labels (-100 on prompt and padding) [batch, pos]."""
    width = max(len(ex.input_ids) for ex in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, ex in enumerate(examples):
        n = len(ex.input_ids)
        ids[row, :n] = torch.tensor(ex.input_ids)
        mask[row, :n] = 1
        labels[row, ex.n_prompt : n] = ids[row, ex.n_prompt : n]
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


@dataclass(frozen=True)
class BatchPlan:
    """Which examples each optimizer step trains on: a function of (seed, step) only."""

    n_examples: int
    batch_size: int
    epochs: int
    seed: int
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.n_examples < self.batch_size:
            raise ConfigError(
                f"batch_size {self.batch_size} is larger than the {self.n_examples} training examples; "
                "lower --batch-size or use more data"
            )

    @property
    def steps_per_epoch(self) -> int:
        return self.n_examples // self.batch_size

    @property
    def total_steps(self) -> int:
        return self.max_steps if self.max_steps is not None else self.epochs * self.steps_per_epoch

    def epoch_of(self, step: int) -> float:
        return step / self.steps_per_epoch

    def step_indices(self, step: int) -> list[int]:
        """The `batch_size` example indices of optimizer step `step` (0-based)."""
        epoch, position = divmod(step, self.steps_per_epoch)
        order = _permutation(self.n_examples, self.seed, epoch)
        return order[position * self.batch_size : (position + 1) * self.batch_size]


@lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen).tolist()


def rank_micro_batches(indices: list[int], rank: int, world: int, micro_batch_size: int) -> list[list[int]]:
    """This process's share of a global batch (a contiguous 1/world), cut into micro-batches."""
    share = len(indices) // world
    mine = indices[rank * share : (rank + 1) * share]
    return [mine[i : i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)]
