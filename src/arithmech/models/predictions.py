"""Does the model answer? Top-1 prediction and answer probability at END, for filtering and knockout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arithmech.models.view import ModelView


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
