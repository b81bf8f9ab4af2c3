"""The reference set's answer check: batched by length with the shared start run once, it reads exactly the
tokens the per-row check read; it keeps only numbers the model ends; its result is reused from the run folder."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from arithmech.data import reference_set
from arithmech.data.io import write_prompt_file
from arithmech.data.prompts import PromptPair
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import answer_check, answer_sequences, build_reference_set
from arithmech.data.tokens import tokenize_pairs
from arithmech.models.archs import spec_for_model_type
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.models.predictions import predict_at_end, top_tokens_at
from arithmech.models.view import ModelView

from tiny_models import PAD_ID, TINY_ARCHS, make_tiny_model, make_tiny_tokenizer

SHOTS = "12+5=17\n3+40=43\n"


def _pairs() -> list[PromptPair]:
    """Answers of 1-3 tokens, prompts of many lengths; most share the solved examples, a few start otherwise."""
    pairs = []
    for a, b in [(1, 2), (31, 4), (250, 7), (9, 90), (45, 55), (6, 0), (77, 8), (123, 456), (5, 5), (60, 3)]:
        for shots in (SHOTS, SHOTS, "7+7=14\n"):
            ref = f"{shots}{a}+{b}="
            pairs.append(PromptPair(ref, f"{shots}{a}-{b}=", str(a + b)))
    return pairs


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_batched_check_reads_the_tokens_of_the_per_row_check(arch: str) -> None:
    """Each row's top token at END, as the per-row check (`predict_at_end`) read it, is the batched check's, bit
    for bit: so the kept set ("every answer token is the top one") is the same."""
    model = make_tiny_model(arch, seed=0)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    tokenized, _ = tokenize_pairs(make_tiny_tokenizer(), _pairs(), answer_digits=True)
    assert len(set(tokenized.end.tolist())) > 5 and len(tokenized.end) > tokenized.n_pairs  # lengths, digits
    old = predict_at_end(view, tokenized.ref_ids, tokenized.ref_mask, tokenized.end, tokenized.answer_ids, 4)
    sequences, reads, answers = answer_sequences(tokenized)
    new = top_tokens_at(view, sequences, reads, PAD_ID, batch_size=4)
    per_row = [tok for top in new for tok in top[:-1]]  # the last read is the token after the answer
    assert per_row == old.top_token.tolist()
    # the kept set, with the model's own tokens as the answers of every other pair so that some are kept
    own = torch.where(tokenized.pair_index % 2 == 0, old.top_token, tokenized.answer_ids)
    misses = (own != old.top_token).long()  # [row]
    wrong = torch.zeros(tokenized.n_pairs, dtype=torch.long).index_add_(0, tokenized.pair_index, misses)
    starts = [0] + torch.cumsum(torch.tensor([len(a) for a in answers]), 0).tolist()
    kept_new = [top[:-1] == own[starts[i] : starts[i + 1]].tolist() for i, top in enumerate(new)]
    assert kept_new == (wrong == 0).tolist() and any(kept_new) and not all(kept_new)


def test_shared_start_runs_once() -> None:
    """A batch whose sequences share their solved examples runs those tokens once: fewer token-layers."""
    model = make_tiny_model("llama", seed=0)
    view = ModelView(model, spec_for_model_type("llama"))
    seen: list[int] = []
    hook = view.attn_norm(0).register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[:-1].numel()))
    try:
        ids = [list((SHOTS + f"{a}+1=").encode()) for a in range(10, 14)]
        top_tokens_at(view, ids, [[len(s) - 1] for s in ids], PAD_ID, batch_size=4)
    finally:
        hook.remove()
    shared = len(SHOTS.encode()) + 1  # the examples and the query's first digit
    assert sum(seen) == shared + 4 * (len(ids[0]) - shared)


def _digit_prompts(handle: ModelHandle) -> tuple[PromptPair, PromptPair]:
    """Two prompts the tiny model answers with a digit: after one it writes another digit, after one it stops."""
    rng = random.Random(0)
    texts = [f"{rng.randrange(100)}+{rng.randrange(100)}={rng.randrange(200)}\n{rng.randrange(100)}+"
             f"{rng.randrange(100)}=" for _ in range(3000)]  # fmt: skip
    ids = [list(t.encode()) for t in texts]
    first = top_tokens_at(handle.view, ids, [[len(s) - 1] for s in ids], PAD_ID, batch_size=256)
    digits = [(t, chr(top[0])) for t, top in zip(texts, first, strict=True) if chr(top[0]).isdigit()]
    after = top_tokens_at(handle.view, [list((t + d).encode()) for t, d in digits],
                          [[len(t)] for t, _ in digits], PAD_ID, batch_size=256)  # fmt: skip
    going = [(t, d) for (t, d), top in zip(digits, after, strict=True) if chr(top[0]).isdigit()]
    ending = [(t, d) for (t, d), top in zip(digits, after, strict=True) if not chr(top[0]).isdigit()]
    assert going and ending, "no prompt found; widen the search"
    return tuple(PromptPair(t, t[:-2] + "@" + t[-1], d) for t, d in (going[0], ending[0]))  # type: ignore[return-value]


def test_a_number_the_model_does_not_end_is_not_answered(tiny_model_dir: Callable[[str], Path], tmp_path: Path) -> None:
    """Answer 7 where the model writes 73 is wrong: the next top token must not be a digit (fails before the
    fix, which kept both prompts)."""
    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama"))))
    going, ending = _digit_prompts(handle)
    write_prompt_file(tmp_path / "p.jsonl", [going, ending])
    cfg = ReferenceSetConfig(prompts_file=str(tmp_path / "p.jsonl"), max_prompts=4)
    ref = build_reference_set(handle, cfg)
    assert ref.counts["answered_correctly"] == 1
    assert [p.reference for p in ref.tokenized.unique_pairs()] == [ending.reference]


def test_check_is_saved_and_reused(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check's tokens are kept in the folder given, and a rerun reads them instead of running the model; other
    prompts are another file. The progress bar is told its total."""
    handle = load_model(ModelConfig(model=str(tiny_model_dir("gpt2"))))
    tokenized, _ = tokenize_pairs(handle.tokenizer, _pairs(), answer_digits=True)

    class Bar:
        total: float | None = None
        done = 0

        def update(self, n: float | None = 1) -> bool | None:
            self.done += int(n or 0)
            return None

    bar = Bar()
    first = answer_check(handle, tokenized, 8, tmp_path, bar)
    assert bar.total == bar.done == tokenized.n_pairs
    assert len(list(tmp_path.glob("answer-check-*.json"))) == 1

    def must_not_run(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the saved check was not reused")

    monkeypatch.setattr(reference_set, "top_tokens_at", must_not_run)
    assert torch.equal(answer_check(handle, tokenized, 8, tmp_path), first)
    monkeypatch.undo()
    answer_check(handle, tokenized.take_pairs([0, 1, 2]), 8, tmp_path)
    assert len(list(tmp_path.glob("answer-check-*.json"))) == 2
