"""Clean and counterfactual prompts for edge circuits, and MIB's metric on them.

Edge patching swaps a sender's output position by position, so each clean prompt and its counterfactual must
have the same token length (MIB's rule); prompts of different lengths sit in one right-padded batch and each
is read at its own last token (END).

Metric (MIB): m = logit[answer] - logit[counterfactual answer] at END, read out in float32 (`ModelView`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arithmech.errors import DataError
from arithmech.models.shared_prefix import common_prefix_length
from arithmech.models.view import ModelView


@dataclass(frozen=True)
class CircuitBatch:
    """Right-padded clean and counterfactual prompts sharing one attention mask."""

    clean_ids: torch.Tensor  # [batch, pos]
    cf_ids: torch.Tensor  # [batch, pos]
    mask: torch.Tensor  # [batch, pos]
    answer_ids: torch.Tensor  # [batch] clean answer token
    cf_answer_ids: torch.Tensor  # [batch] counterfactual answer token

    def __post_init__(self) -> None:
        if self.clean_ids.shape != self.cf_ids.shape or self.clean_ids.shape != self.mask.shape:
            raise DataError(
                "each clean prompt and its counterfactual must have the same token length for edge patching; "
                "drop the pairs whose lengths differ"
            )

    def __len__(self) -> int:
        return int(self.clean_ids.shape[0])

    @property
    def end(self) -> torch.Tensor:
        """[batch] index of each prompt's last real token."""
        return self.mask.long().sum(-1) - 1

    @property
    def shared_positions(self) -> int:
        """How many first positions hold the same token in every clean and counterfactual prompt (short of the
        earliest END): no edge changes anything there (`patched_end_resid(shared=...)`)."""
        ids = torch.cat([self.clean_ids, self.cf_ids])
        return common_prefix_length(ids, self.end.repeat(2))

    def select(self, idx: slice) -> CircuitBatch:
        """A sub-batch of prompts, trimmed to its own longest prompt."""
        width = int(self.mask[idx].sum(-1).max())
        return CircuitBatch(
            self.clean_ids[idx, :width], self.cf_ids[idx, :width], self.mask[idx, :width],
            self.answer_ids[idx], self.cf_answer_ids[idx],
        )  # fmt: skip

    def chunks(self, batch_size: int) -> list[CircuitBatch]:
        return [self.select(slice(start, start + batch_size)) for start in range(0, len(self), batch_size)]


def logit_difference(view: ModelView, end_resid: torch.Tensor, batch: CircuitBatch) -> torch.Tensor:
    """[batch] logit[answer] - logit[counterfactual answer] from the residual entering the final norm at END."""
    return view.answer_logits(end_resid, batch.answer_ids) - view.answer_logits(end_resid, batch.cf_answer_ids)


def at_end(x: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """[batch, pos, d] -> [batch, d] at each row's END."""
    return x[torch.arange(x.shape[0], device=x.device), end.to(x.device)]
