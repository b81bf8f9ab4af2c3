"""Batched greedy generation: the model's own continuation of each prompt, deterministic and cut at stop strings.

How
    Prompts are sorted by token length (less padding) and run in batches of `batch_size`, left-padded so that
    every row's last prompt token sits at the same position and generation appends to all rows at once
    (`model.generate`, do_sample=False, a fresh GenerationConfig so that a checkpoint's sampling defaults
    never apply). A row is finished at the model's end-of-sequence token or when its new text contains a stop
    string; the batch ends when every row is finished or after `max_new_tokens`. The text is then cut before
    the first stop string (post-hoc, since a stop string can end inside a token). Results come back in the
    order of the prompts.

    A prompt longer than the model's context minus max_new_tokens keeps its last tokens (left truncation, as
    lm-evaluation-harness does) and is reported as truncated. The reserve for new tokens is at most half the
    context, so a max_new_tokens past the context keeps the prompt; a batch then generates only up to the
    context's end (a learned position table has no row past it).

    Greedy decoding is deterministic for a fixed batch composition; left padding can change the last bits of
    a row's logits, so a different batch_size can (rarely) flip a near-tie.

Usage
    >>> outs = generate_greedy(handle.model, handle.tokenizer, ["Q: 2+2?\\nA:"], max_new_tokens=32)
    >>> outs[0].text
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from arithmech.data.tokens import pad_id_of
from arithmech.models.context import context_length
from arithmech.progress import Progress


@dataclass(frozen=True)
class Generation:
    """One prompt's continuation: the text (cut at the first stop string), its token count, and flags."""

    text: str
    n_tokens: int
    stopped: bool
    """True when a stop string or end-of-sequence ended it, False when max_new_tokens did."""
    truncated: bool
    """True when the prompt was left-truncated to fit the context."""


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """The text before the earliest stop string, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


class _StopOnStrings:
    """A stopping criterion: per row, done when its newest text holds a stop string (transformers >= 4.39)."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_len: int, window: int = 24) -> None:
        self.tokenizer, self.stops, self.prompt_len, self.window = tokenizer, tuple(stops), prompt_len, window

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        new = input_ids[:, self.prompt_len :]
        tails = self.tokenizer.batch_decode(new[:, -self.window :], skip_special_tokens=True)
        done = [any(s in tail for s in self.stops) for tail in tails]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    for value in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


@torch.no_grad()
def generate_greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int = 256,
    batch_size: int = 8,
    stops: Sequence[str] = (),
    add_special_tokens: bool = True,
    progress: Progress | None = None,
) -> list[Generation]:
    """Greedy continuations of `prompts`, in order (see the module docstring)."""
    from transformers import GenerationConfig, StoppingCriteriaList

    encoded = [tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"] for p in prompts]
    limit = context_length(model)
    keep = None if limit is None else limit - min(max_new_tokens, limit // 2)
    truncated = [keep is not None and len(ids) > keep for ids in encoded]
    encoded = [ids[-keep:] if keep is not None else ids for ids in encoded]
    pad = pad_id_of(tokenizer)
    eos = _eos_ids(model, tokenizer)
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    out: dict[int, Generation] = {}
    if progress is not None:
        progress.total = len(prompts)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(encoded[i]) for i in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, i in enumerate(rows):  # left padding: [batch, width], real tokens at the right end
            ids[r, width - len(encoded[i]) :] = torch.tensor(encoded[i])
            mask[r, width - len(encoded[i]) :] = 1
        criteria = StoppingCriteriaList([_StopOnStrings(tokenizer, stops, width)]) if stops else None
        budget = max_new_tokens if limit is None else min(max_new_tokens, limit - width)
        config = GenerationConfig(
            do_sample=False, max_new_tokens=budget, pad_token_id=pad, eos_token_id=eos or None, use_cache=True
        )
        generated = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config,
            stopping_criteria=criteria,
        )[:, width:].cpu()  # [batch, new tokens]
        for r, i in enumerate(rows):
            tokens = generated[r].tolist()
            at_eos = next((k for k, t in enumerate(tokens) if t in eos), None)
            if at_eos is not None:
                tokens = tokens[: at_eos + 1]
            else:
                while tokens and tokens[-1] == pad:  # rows finished by a stop string are padded to the end
                    tokens.pop()
            text, hit = cut_at_stop(tokenizer.decode(tokens, skip_special_tokens=True), stops)
            out[i] = Generation(text, len(tokens), hit or at_eos is not None, truncated[i])
        if progress is not None:
            progress.update(len(rows))
    return [out[i] for i in range(len(prompts))]
