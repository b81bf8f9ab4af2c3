"""A cheap general-ability check: perplexity on plain text, and KL divergence from the base model.

Background
    Zhang et al. (2024, Table 1) check that precise SFT keeps general ability with MMLU and CSQA. For a small
    model those are near chance and noisy, so a cheaper and more sensitive check is how much a fine-tuned
    model's next-token distribution on ordinary English has moved: its perplexity, and its KL divergence from
    the model it was tuned from (Zhang et al. do not use this; it is ours, METHODS.md sec. 8).

Formulas (per text t with tokens x_0 .. x_{n-1}; every position k = 1 .. n-1 is predicted from x_{<k})
    NLL(t)      = - sum_k log p_tuned(x_k | x_{<k})
    perplexity  = exp( sum_t NLL(t) / sum_t (n_t - 1) )                      (token-weighted over all texts)
    KL(t)       = sum_k sum_v p_base(v | x_{<k}) [log p_base(v | x_{<k}) - log p_tuned(v | x_{<k})]
    kl          = sum_t KL(t) / sum_t (n_t - 1)                              (nats per token, KL(base || tuned))
    All from full-vocabulary log-softmax in float32 (float64 for a float64 model), soft-capped like the model's
    own logits. The first token of a text is not predicted (a tokenizer that adds BOS makes it predicted). Texts
    longer than max_tokens keep their first max_tokens tokens. Base and tuned model must tokenize every text
    identically and have the same vocabulary size (checked).

Text
    Built in: `data/general_text.jsonl`, 30 paragraphs of plain English written for this package (history,
    science, cooking, travel, sport, ...; no arithmetic). Or a user's file: JSONL rows with "text" (and
    optionally "id"), or plain text whose paragraphs are separated by blank lines (`general_texts.py` reads
    them, without torch).

Usage
    >>> texts = load_general_texts()
    >>> result = general_scores(tuned.view, tuned.tokenizer, texts, base_view=base.view)
    >>> result.perplexity, result.base_perplexity, result.kl
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from arithmech.data.tokens import pad_id_of
from arithmech.errors import ConfigError, DataError
from arithmech.evaluate.general_texts import GeneralText
from arithmech.models.view import ModelView
from arithmech.progress import Progress


@dataclass(frozen=True)
class TextScore:
    """One text: predicted tokens, the tuned model's NLL, and (with a base model) its NLL and summed KL."""

    id: str
    n_tokens: int
    nll: float
    base_nll: float | None = None
    kl: float | None = None


@dataclass(frozen=True)
class GeneralResult:
    texts: list[TextScore]

    @property
    def n_tokens(self) -> int:
        return sum(t.n_tokens for t in self.texts)

    @property
    def perplexity(self) -> float:
        return math.exp(sum(t.nll for t in self.texts) / self.n_tokens)

    @property
    def base_perplexity(self) -> float | None:
        if any(t.base_nll is None for t in self.texts):
            return None
        return math.exp(sum(t.base_nll or 0.0 for t in self.texts) / self.n_tokens)

    @property
    def kl(self) -> float | None:
        if any(t.kl is None for t in self.texts):
            return None
        return sum(t.kl or 0.0 for t in self.texts) / self.n_tokens


def _log_probs(view: ModelView, rows: list[list[int]], pad: int) -> list[torch.Tensor]:
    """Per row, log softmax of the logits at positions 0 .. n-2: [n - 1, d_vocab], at least float32."""
    device = view.o_proj(0).weight.device
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    for b, row in enumerate(rows):  # right padding: [batch, width]; no attention mask (see choice.py)
        ids[b, : len(row)] = torch.tensor(row)
    resid = view.final_resid(input_ids=ids.to(device), use_cache=False)  # [batch, width, d_model]
    out = []
    for b, row in enumerate(rows):
        logits = view.vocab_logits(resid[b, : len(row) - 1])  # [n-1, d_vocab], float32 readout
        out.append(logits.log_softmax(-1))
    return out


@torch.no_grad()
def general_scores(
    view: ModelView,
    tokenizer: Any,
    texts: Sequence[GeneralText],
    base_view: ModelView | None = None,
    base_tokenizer: Any = None,
    max_tokens: int = 512,
    batch_size: int = 4,
    progress: Progress | None = None,
) -> GeneralResult:
    """Perplexity of `view`'s model on `texts`, and with `base_view` the base perplexity and KL(base || tuned)."""
    if base_view is not None and base_view.dims.d_vocab != view.dims.d_vocab:
        raise ConfigError(
            f"base model vocabulary ({base_view.dims.d_vocab}) differs from the tuned model's "
            f"({view.dims.d_vocab}); KL needs the same vocabulary"
        )
    encoded = [tokenizer(t.text, truncation=True, max_length=max_tokens)["input_ids"] for t in texts]
    if base_view is not None and base_tokenizer is not None:
        for t, ids in zip(texts, encoded, strict=True):
            if base_tokenizer(t.text, truncation=True, max_length=max_tokens)["input_ids"] != ids:
                raise ConfigError(f"base and tuned tokenizers split text {t.id!r} differently; KL needs one tokenizer")
    short = [t.id for t, ids in zip(texts, encoded, strict=True) if len(ids) < 2]
    if short:
        raise DataError(f"general text(s) {', '.join(short)} have fewer than 2 tokens; give longer paragraphs")
    pad = pad_id_of(tokenizer)
    scores: list[TextScore] = []
    if progress is not None:
        progress.total = len(encoded)
    for start in range(0, len(encoded), batch_size):
        rows = encoded[start : start + batch_size]
        tuned = _log_probs(view, rows, pad)
        base = _log_probs(base_view, rows, pad) if base_view is not None else [None] * len(rows)
        for k, (row, lp_t, lp_b) in enumerate(zip(rows, tuned, base, strict=True)):
            target = torch.tensor(row[1:], device=lp_t.device)[:, None]  # [n-1, 1]
            nll = float(-lp_t.gather(1, target).sum())
            base_nll = kl = None
            if lp_b is not None:
                lp_b = lp_b.to(lp_t.device)
                base_nll = float(-lp_b.gather(1, target).sum())
                kl = float((lp_b.exp() * (lp_b - lp_t)).sum())
            scores.append(TextScore(texts[start + k].id, len(row) - 1, nll, base_nll, kl))
        if progress is not None:
            progress.update(len(rows))
    return GeneralResult(scores)
