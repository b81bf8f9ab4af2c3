"""Does the model answer? Top-1 prediction and answer probability at END, for filtering and knockout.

`top_tokens_at` reads the top token at several positions of each token sequence: a prompt followed by its whole
answer gives, in one pass, the prediction of every answer token on the answer's earlier ones (teacher forcing)
and of the token after the answer. Its batches hold sequences of about one length (sorted, so little padding),
run the tokens that a batch's sequences share at the start once (`models/shared_prefix.py`), and put only the
read positions through the vocabulary projection. Its work is one plain forward pass of the unpadded sequences,
less the shared starts, plus one vocabulary row per read position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from arithmech.models.shared_prefix import SharedPrefix, common_prefix_length
from arithmech.models.view import ModelView
from arithmech.progress import Progress


@dataclass(frozen=True)
class EndPredictions:
    """Per prompt: the top token at END, and probability and logit of the answer token."""

    top_token: torch.Tensor  # [batch]
    answer_prob: torch.Tensor  # [batch]
    answer_logit: torch.Tensor  # [batch]
    correct: torch.Tensor  # [batch] bool: top token == answer token


@torch.no_grad()
def predict_at_end(
    view: ModelView,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    end: torch.Tensor,
    answer_ids: torch.Tensor,
    batch_size: int = 32,
) -> EndPredictions:
    """Run the model over right-padded prompts in chunks and read the END distribution of each."""
    at_end = []
    for start in range(0, len(end), batch_size):
        rows = slice(start, start + batch_size)
        width = int(end[rows].max()) + 1
        at_end.append(view.end_logits(input_ids[rows, :width], attention_mask[rows, :width], end[rows]))
    return read_predictions(at_end, answer_ids)


def read_predictions(at_end: list[torch.Tensor], answer_ids: torch.Tensor) -> EndPredictions:
    """Predictions from the END logits [rows, d_vocab] of consecutive chunks of the prompts."""
    tops, probs, logits_out = [], [], []
    start = 0
    for logits in at_end:
        answers = answer_ids[start : start + len(logits)].to(logits.device)
        start += len(logits)
        tops.append(logits.argmax(-1).cpu())
        probs.append(logits.softmax(-1).gather(1, answers[:, None])[:, 0].cpu())
        logits_out.append(logits.gather(1, answers[:, None])[:, 0].cpu())
    top = torch.cat(tops)
    return EndPredictions(top, torch.cat(probs), torch.cat(logits_out), top == answer_ids.cpu())



@torch.no_grad()
def top_tokens_at(
    view: ModelView,
    sequences: Sequence[Sequence[int]],
    reads: Sequence[Sequence[int]],
    pad: int,
    batch_size: int = 32,
    progress: Progress | None = None,
) -> list[list[int]]:
    """The model's top token at positions `reads[i]` of each token sequence i (see the module docstring), in
    sequence order; `progress` counts sequences."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    tops: list[list[int]] = [[] for _ in sequences]
    if progress is not None:
        progress.total = len(sequences)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        tokens = [torch.tensor(list(sequences[i]), dtype=torch.long) for i in rows]
        ids = pad_sequence(tokens, batch_first=True, padding_value=pad)  # [rows, width], right-padded
        mask = pad_sequence([torch.ones_like(t) for t in tokens], batch_first=True)  # 1 = real token
        first_read = torch.tensor([min(reads[i]) for i in rows])
        shared = common_prefix_length(ids, first_read)  # every read position stays after it
        resid = SharedPrefix.of_tokens(view, ids[0, :shared]).final_resid(ids[:, shared:], mask[:, shared:])
        which = torch.tensor([b for b, i in enumerate(rows) for _ in reads[i]], device=resid.device)
        at = torch.tensor([p - shared for i in rows for p in reads[i]], device=resid.device)
        top = view.vocab_logits(resid[which, at]).float().argmax(-1).tolist()  # [reads of the batch]
        offset = 0
        for i in rows:
            tops[i] = top[offset : offset + len(reads[i])]
            offset += len(reads[i])
        if progress is not None:
            progress.update(len(rows))
    return tops
