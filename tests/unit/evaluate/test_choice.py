"""Choice log-likelihood (evaluate/choice.py) against a direct per-choice forward pass on tiny random models.

The reference runs the model once per (context, option) on the unpadded token ids of context + option and sums
log_softmax(model(ids).logits) over the option's tokens -- the model's own logits (soft-cap included), no
batching, no shortcut for one-token options.
"""

from __future__ import annotations

import pytest
import torch

from arithmech.errors import DataError
from arithmech.evaluate.choice import ChoiceScore, continuation_span, predict, score_choices
from arithmech.models.archs import spec_for_model_type
from arithmech.models.view import ModelView

from tiny_models import make_tiny_model, make_tiny_tokenizer

CONTEXTS = ["Question: 3+4?\nAnswer:", "Q: What do cows eat?\nA:", "The capital of France is"]
OPTIONS = [[" 7", " 8", " 12"], [" A", " B", " C", " D"], [" Paris", " a city in Europe", " Rome"]]


def view_of(arch: str, dtype: torch.dtype) -> ModelView:
    model = make_tiny_model(arch, seed=0).to(dtype)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def direct_scores(model: torch.nn.Module, tokenizer, context: str, options: list[str]) -> list[float]:
    out = []
    n_ctx = len(tokenizer(context)["input_ids"])
    for option in options:
        ids = tokenizer(context + option)["input_ids"]
        with torch.no_grad():
            logprobs = model(torch.tensor([ids])).logits[0].log_softmax(-1)  # [pos, d_vocab]
        out.append(sum(float(logprobs[k - 1, ids[k]]) for k in range(n_ctx, len(ids))))
    return out


@pytest.mark.parametrize(
    ("arch", "batch_size"), [("llama", 1), ("llama", 4), ("gpt2", 4), ("gemma2", 4), ("qwen2", 3)]
)
def test_matches_direct_forward_float64(arch: str, batch_size: int) -> None:
    view = view_of(arch, torch.float64)
    tok = make_tiny_tokenizer()
    got = score_choices(view, tok, CONTEXTS, OPTIONS, batch_size=batch_size)
    for context, options, row in zip(CONTEXTS, OPTIONS, got, strict=True):
        want = direct_scores(view.model, tok, context, options)
        assert [s.logprob for s in row] == pytest.approx(want, abs=1e-8)
        assert [s.n_tokens for s in row] == [len(o.encode()) for o in options]  # byte tokens
        assert [s.n_chars for s in row] == [len(o) for o in options]


def test_matches_direct_forward_float32_padded_batch() -> None:
    """float32, right padding across rows of different lengths: within 1e-5 of the unpadded reference."""
    view = view_of("llama", torch.float32)
    tok = make_tiny_tokenizer()
    got = score_choices(view, tok, CONTEXTS, OPTIONS, batch_size=16)
    for context, options, row in zip(CONTEXTS, OPTIONS, got, strict=True):
        want = direct_scores(view.model, tok, context, options)
        assert [s.logprob for s in row] == pytest.approx(want, abs=1e-5, rel=1e-5)


def test_one_token_options_share_one_pass() -> None:
    """The one-token shortcut (letters) gives the same numbers as scoring each option as its own row."""
    view = view_of("llama", torch.float64)
    tok = make_tiny_tokenizer()
    context = "Pick one.\nAnswer:"
    letters = [" A", " B", " C", " D"]  # two bytes: not one token, scored as rows
    single = ["A", "B", "C", "D"]  # one byte each: the shortcut
    rows = score_choices(view, tok, [context], [letters])[0]
    short = score_choices(view, tok, [context + " "], [single])[0]
    assert [s.logprob for s in short] == pytest.approx(direct_scores(view.model, tok, context + " ", single), abs=1e-8)
    assert [s.logprob for s in rows] == pytest.approx(direct_scores(view.model, tok, context, letters), abs=1e-8)
    assert all(s.n_tokens == 1 for s in short)


class MergingTokenizer:
    """Greedy longest-match over a small vocabulary, so that "a" + "b" merge into one token "ab"."""

    vocab = {"ab": 0, "a": 1, "b": 2, "x": 3, "c": 4}

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids, i = [], 0
        while i < len(text):
            piece = text[i : i + 2] if text[i : i + 2] in self.vocab else text[i]
            ids.append(self.vocab[piece])
            i += len(piece)
        return {"input_ids": ids}


def test_boundary_merge_scores_from_first_changed_token() -> None:
    tok = MergingTokenizer()
    whole, start = continuation_span(tok, "xa", "bc")  # "xabc" -> x, ab, c: the context's "a" merged into "ab"
    assert whole == [3, 0, 4] and start == 1
    whole, start = continuation_span(tok, "xc", "ab")  # no merge: x, c | ab
    assert whole == [3, 4, 0] and start == 2


def test_empty_context_or_choice_is_data_error() -> None:
    tok = make_tiny_tokenizer()
    with pytest.raises(DataError, match="adds no token"):
        continuation_span(tok, "Answer:", "")
    with pytest.raises(DataError, match="no token before"):
        continuation_span(tok, "", " A")


def test_predict_sum_and_length_normalised() -> None:
    scores = [ChoiceScore(-4.0, 2, 2), ChoiceScore(-6.0, 6, 12), ChoiceScore(-4.0, 1, 1)]
    assert predict(scores) == 0  # ties go to the first
    assert predict(scores, normalize=True) == 1  # -0.5 per character
