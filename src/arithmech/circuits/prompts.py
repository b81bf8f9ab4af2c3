"""MIB prompt pairs as a `CircuitBatch`, kept only where the model predicts the scored answer token (MIB's rule)."""

from __future__ import annotations

import torch

from arithmech.circuits.batch import CircuitBatch, at_end
from arithmech.data.prompts import PromptPair
from arithmech.data.tokens import pad_id_of
from arithmech.errors import DataError
from arithmech.models.view import ModelView


def circuit_batch(tokenizer: object, pairs: list[PromptPair]) -> CircuitBatch:
    """Right-padded token tensors of pairs made by `data.mib_arithmetic.mib_pairs` (equal lengths per pair)."""
    if not pairs:
        raise DataError("no prompt pairs to score; raise --n-prompts or check the operations")
    clean = [list(tokenizer(p.reference)["input_ids"]) for p in pairs]  # type: ignore[operator]
    cf = [list(tokenizer(p.counterfactual)["input_ids"]) for p in pairs]  # type: ignore[operator]
    width = max(len(ids) for ids in clean)
    pad = pad_id_of(tokenizer)

    def padded(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor([ids + [pad] * (width - len(ids)) for ids in rows])

    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in clean])
    return CircuitBatch(
        clean_ids=padded(clean), cf_ids=padded(cf), mask=mask,
        answer_ids=torch.tensor([int(p.extra["answer_id"]) for p in pairs]),
        cf_answer_ids=torch.tensor([int(p.extra["cf_answer_id"]) for p in pairs]),
    )  # fmt: skip


@torch.no_grad()
def predicted_rows(view: ModelView, batch: CircuitBatch, batch_size: int = 32) -> torch.Tensor:
    """[batch] bool: the model's top token at END is the scored answer token, on the clean prompt."""
    kept = []
    for chunk in batch.chunks(batch_size):
        resid = view.final_resid(
            input_ids=chunk.clean_ids.to(view.o_proj(0).weight.device),
            attention_mask=chunk.mask.to(view.o_proj(0).weight.device),
            use_cache=False,
        )
        top = view.vocab_logits(at_end(resid, chunk.end)).argmax(-1).cpu()
        kept.append(top == chunk.answer_ids)
    return torch.cat(kept)
