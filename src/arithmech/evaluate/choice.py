"""Multiple choice by log-likelihood: how likely the model finds each option's continuation after the prompt.

Formula
    For a context c and an option continuation o, with the token ids of c and of the concatenated text c + o,

        t   = tokens(c + o),   s = length of the common prefix of tokens(c) and t
        LL  = sum_{k = s .. |t| - 1}  log softmax(logits(t[:k]))[t[k]]   (float32; float64 for a float64 model)

    i.e. only the tokens that the option adds are scored, each given everything before it. Tokenizing the
    concatenation (not c and o apart) keeps the tokenizer's own boundary: when the last context token merges
    with the option's first characters, scoring starts at the first token that differs, so every option is
    scored on the text it changes (the lm-evaluation-harness convention; a prompt ending "Answer:" and options
    " A" / " Paris" never merge in practice). The prediction is argmax LL (`accuracy`); the length-normalised
    variant divides LL by the option's length in characters, leading space included (`acc_norm` of
    lm-evaluation-harness), so that long options are not penalised for their length.

How
    Options that add exactly one token after an unchanged context (MMLU letters " A" ... " D") are read from one
    forward pass of the context: the last position's distribution scores them all. Other options run as their
    own rows (context + option), right-padded, sorted by length, `batch_size` rows per forward pass. Right
    padding needs no attention mask: in a causal model no real position sees the pads after it, and leaving
    the pads unmasked avoids fully masked rows (NaN in some eager float64 sliding-window masks). Logits
    come from the residual entering the final norm, read out in float32 (final norm, unembedding, Gemma's
    soft-cap) at the scored positions only, as `ModelView.end_logits` does. Rows longer than the model's
    context keep their last tokens.

Usage
    >>> scores = score_choices(handle.view, handle.tokenizer, ["Q: 2+2?\\nAnswer:"], [[" 3", " 4"]])
    >>> best = max(range(2), key=lambda j: scores[0][j].logprob)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from arithmech.data.tokens import continuation_span, pad_id_of
from arithmech.errors import DataError
from arithmech.models.context import context_length
from arithmech.models.view import ModelView
from arithmech.progress import Progress


@dataclass(frozen=True)
class ChoiceScore:
    """One option: summed log-probability of its tokens, their number, and the option's characters."""

    logprob: float
    n_tokens: int
    n_chars: int

    @property
    def per_char(self) -> float:
        return self.logprob / max(self.n_chars, 1)


@dataclass
class ScoredRow:
    """A token sequence and the (position, token) pairs to score; for choices each target belongs to (item, option)."""

    ids: list[int]
    targets: list[tuple[int, int]]
    owners: list[tuple[int, int]] = field(default_factory=list)


def _rows(tokenizer: Any, contexts: Sequence[str], options: Sequence[Sequence[str]], special: bool) -> list[ScoredRow]:
    rows = []
    for i, (context, conts) in enumerate(zip(contexts, options, strict=True)):
        spans = [continuation_span(tokenizer, context, o, special) for o in conts]
        ctx_len = len(tokenizer(context, add_special_tokens=special)["input_ids"])
        if all(start == ctx_len and len(whole) == ctx_len + 1 for whole, start in spans):
            ids = spans[0][0][:ctx_len]  # one pass of the context scores every one-token option
            targets = [(ctx_len - 1, w[-1]) for w, _ in spans]
            rows.append(ScoredRow(ids, targets, [(i, j) for j in range(len(spans))]))
            continue
        for j, (whole, start) in enumerate(spans):
            targets = [(k - 1, whole[k]) for k in range(start, len(whole))]
            rows.append(ScoredRow(whole, targets, [(i, j)] * len(targets)))
    return rows


def truncate_row(row: ScoredRow, limit: int | None) -> ScoredRow:
    """Keep the last `limit` tokens (positions shift left); the scored tokens must survive."""
    if limit is None or len(row.ids) <= limit:
        return row
    cut = len(row.ids) - limit
    if min(pos for pos, _ in row.targets) - cut < 0:
        raise DataError(f"a choice or answer is longer than the model's context ({limit} tokens); it cannot be scored")
    return ScoredRow(row.ids[cut:], [(pos - cut, tok) for pos, tok in row.targets], row.owners)


@torch.no_grad()
def log_prob_batches(
    view: ModelView,
    rows: Sequence[ScoredRow],
    pad: int,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> Iterator[tuple[list[ScoredRow], torch.Tensor]]:
    """Per forward pass (longest rows first, `batch_size` rows): the rows and the log softmax at their target
    positions, [targets of the batch in row order, d_vocab] (see the module docstring); `progress` counts rows."""
    device = view.o_proj(0).weight.device
    order = sorted(range(len(rows)), key=lambda r: -len(rows[r].ids))
    if progress is not None:
        progress.total = len(rows)
    for start in range(0, len(order), batch_size):
        batch = [rows[r] for r in order[start : start + batch_size]]
        width = max(len(r.ids) for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        for b, row in enumerate(batch):  # right padding: [batch, width]; no mask needed (see above)
            ids[b, : len(row.ids)] = torch.tensor(row.ids)
        resid = view.final_resid(input_ids=ids.to(device), use_cache=False)  # [batch, width, d_model]
        which = torch.tensor([b for b, row in enumerate(batch) for _ in row.targets])
        pos = torch.tensor([p for row in batch for p, _ in row.targets])
        picked = resid[which.to(resid.device), pos.to(resid.device)]  # [targets, d_model], before the final norm
        logits = view.vocab_logits(picked)  # [targets, d_vocab], float32 (float64 for a float64 model)
        yield batch, logits.log_softmax(-1)
        if progress is not None:
            progress.update(len(batch))


@torch.no_grad()
def score_choices(
    view: ModelView,
    tokenizer: Any,
    contexts: Sequence[str],
    options: Sequence[Sequence[str]],
    batch_size: int = 8,
    add_special_tokens: bool = True,
    progress: Progress | None = None,
) -> list[list[ChoiceScore]]:
    """LL of every option of every context: result[i][j] for options[i][j] after contexts[i]."""
    limit = context_length(view.model)
    rows = [truncate_row(r, limit) for r in _rows(tokenizer, contexts, options, add_special_tokens)]
    sums = [[0.0] * len(o) for o in options]
    counts = [[0] * len(o) for o in options]
    for batch, logprobs in log_prob_batches(view, rows, pad_id_of(tokenizer), batch_size, progress):
        tokens = torch.tensor([t for row in batch for _, t in row.targets], device=logprobs.device)
        values = logprobs.gather(1, tokens[:, None])[:, 0].cpu().tolist()
        owners = [o for row in batch for o in row.owners]
        for (i, j), lp in zip(owners, values, strict=True):
            sums[i][j] += lp
            counts[i][j] += 1
    return [
        [ChoiceScore(sums[i][j], counts[i][j], len(o)) for j, o in enumerate(conts)]
        for i, conts in enumerate(options)
    ]


def predict(scores: Sequence[ChoiceScore], normalize: bool = False) -> int:
    """The index of the most likely option (first on ties); `normalize` uses the per-character LL."""
    values = [s.per_char if normalize else s.logprob for s in scores]
    return max(range(len(values)), key=values.__getitem__)
