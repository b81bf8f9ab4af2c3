"""MLP logit lens: cosines and ranks equal a direct unbatched recomputation from the model's own block outputs
on sequential (llama), sandwich-norm (gemma2) and parallel-residual (gpt-neox) blocks; token choice rules."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from arithmech.analysis.logit_lens import (
    COSINE_COLUMNS,
    largest_number,
    mlp_cosines,
    number_token_ids,
    operand_token_ids,
    update_ranks,
)
from arithmech.data import PromptPair, tokenize_pairs
from arithmech.errors import DataError
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks, first_tensor, hooks
from arithmech.models.view import ModelView
from arithmech.patching.states import collect_end_states

from tiny_models import make_tiny_model, make_tiny_tokenizer

ARCHS = ["llama", "gemma2", "gpt-neox"]
LENGTHS = [7, 11, 5, 9]


def tiny_view(arch: str) -> ModelView:
    model = make_tiny_model(arch)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def right_padded(vocab: int, lengths: list[int], seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab - 2, (len(lengths), max(lengths)), generator=gen)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = 0
    return ids, mask


@torch.no_grad()
def direct_in_and_update(view: ModelView, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One unpadded prompt: (MLP_in, MLP_out - MLP_in) at its last token, [layer, d_model] each, read from
    the block's own input/output (and the attention output for parallel blocks), not from the MLP module."""
    n = view.dims.n_layers
    block_in: list[Any] = [None] * n
    block_out: list[Any] = [None] * n
    mlp_in: list[Any] = [None] * n
    attn_out: list[Any] = [None] * n

    def save(store: list[Any], layer: int, pre: bool) -> Any:
        def pre_fn(_m: Any, args: tuple[Any, ...]) -> None:
            store[layer] = args[0][0, -1].clone()

        def post_fn(_m: Any, _a: Any, output: Any) -> None:
            store[layer] = first_tensor(output)[0, -1].clone()

        return pre_fn if pre else post_fn

    pre, post = [], []
    for layer in range(n):
        pre += [
            (view.attn_norm(layer), save(block_in, layer, True)),
            (view.mlp_norm(layer), save(mlp_in, layer, True)),
        ]
        post += [(view.blocks[layer], save(block_out, layer, False))]
        post += [(view.o_proj(layer), save(attn_out, layer, False))]  # GPT-NeoX adds it as is
    with hooks(pre=pre, post=post):
        view.model(input_ids=ids[None], use_cache=False)
    if view.parallel_residual:  # block_out = block_in + attention + MLP
        update = [block_out[i] - block_in[i] - attn_out[i] for i in range(n)]
        assert all(torch.equal(mlp_in[i], block_in[i]) for i in range(n))
    else:  # block_out = MLP_in + MLP contribution
        update = [block_out[i] - mlp_in[i] for i in range(n)]
    return torch.stack(mlp_in), torch.stack(update)


def cos64(x: torch.Tensor, w: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(x.double(), w.double(), dim=0))


@pytest.mark.parametrize("arch", ARCHS)
def test_cosines_equal_direct_computation(arch: str) -> None:
    view = tiny_view(arch)
    ids, mask = right_padded(view.dims.d_vocab, LENGTHS)
    end = mask.sum(1) - 1
    gen = torch.Generator().manual_seed(5)
    candidates = torch.arange(48, 58)  # the digit tokens of the byte tokenizer
    a_ids, b_ids = candidates[torch.randint(0, 10, (4,), generator=gen)], candidates[[0, 3, 3, 9]]
    c_ids = torch.tensor([49, 200, 57, 48])  # 200: a target outside the candidates (all 10 are "wrong")
    states = collect_end_states(view, ids, mask, end)
    got = mlp_cosines(view, states, a_ids, b_ids, c_ids, candidates)
    assert count_hooks(view.model) == 0
    assert set(got) == set(COSINE_COLUMNS)
    w_u = view.unembed.weight.detach()
    for i, n in enumerate(LENGTHS):
        mlp_in, update = direct_in_and_update(view, ids[i, :n])
        for layer in range(view.dims.n_layers):
            for name, x, target in (
                ("cos_in_A", mlp_in[layer], a_ids[i]),
                ("cos_in_B", mlp_in[layer], b_ids[i]),
                ("cos_update_C", update[layer], c_ids[i]),
            ):
                wrong = [cos64(x, w_u[t]) for t in candidates.tolist() if t != int(target)]
                assert got[name][layer, i].item() == pytest.approx(cos64(x, w_u[target]), abs=1e-5)
                assert got[f"{name}_wrong"][layer, i].item() == pytest.approx(
                    sum(wrong) / len(wrong), abs=1e-5
                )


@pytest.mark.parametrize("arch", ARCHS)
def test_ranks_equal_full_vocabulary_sort(arch: str) -> None:
    view = tiny_view(arch)
    ids, mask = right_padded(view.dims.d_vocab, LENGTHS)
    states = collect_end_states(view, ids, mask, mask.sum(1) - 1)
    numbers = torch.tensor([48, 52, 57, 100, 3])
    prompt = 2
    got = update_ranks(view, states, numbers, prompt=prompt)
    assert got.shape == (view.dims.n_layers, len(numbers))
    _, update = direct_in_and_update(view, ids[prompt, : LENGTHS[prompt]])
    with torch.no_grad():
        logits = view.model.get_output_embeddings()(view.final_norm(update))  # [layer, d_vocab]
    for layer in range(view.dims.n_layers):
        order = torch.argsort(logits[layer], descending=True).tolist()
        assert got[layer].tolist() == [order.index(t) for t in numbers.tolist()]


def pair(reference: str, answer: str, a: str | None, b: str | None, spans: bool = True) -> PromptPair:
    found = {"A": reference.rindex(a), "B": reference.rindex(b)} if (a and b) else {}
    span = {k: (v, v + len(a if k == "A" else b or "")) for k, v in found.items()} if spans else {}
    counterfactual = reference.replace("+", "@").replace("plus", "xxxx")
    return PromptPair(reference, counterfactual, answer, a=a, b=b, spans=span)  # type: ignore[arg-type]


def test_operand_tokens_are_the_tokens_the_model_saw() -> None:
    tokenizer = make_tiny_tokenizer()
    pairs = [pair("1 + 2 = 3\n4 + 5 = ", "9", "4", "5"), pair("Q: 7 plus 12? A: ", "19", "7", "12")]
    tokenized, _ = tokenize_pairs(tokenizer, pairs, first_token_answers=True)  # "19": only operands matter here
    a_ids, b_ids = operand_token_ids(tokenizer, pairs)
    for role, ids in (("A", a_ids), ("B", b_ids)):
        first = [
            int(row[mask].tolist()[0])
            for row, mask in zip(tokenized.ref_ids, tokenized.role_mask(role), strict=True)
        ]
        assert ids.tolist() == first
    assert b_ids.tolist() == [ord("5"), ord("1")]  # multi-digit operand: its first token
    # Without spans the operand is found by its text: same tokens here.
    no_spans = [pair(p.reference, p.answer, p.a, p.b, spans=False) for p in pairs]
    assert [t.tolist() for t in operand_token_ids(tokenizer, no_spans)] == [a_ids.tolist(), b_ids.tolist()]


def test_number_tokens_of_a_digit_tokenizer_are_the_ten_digits() -> None:
    tokenizer = make_tiny_tokenizer()
    pairs = [pair("1 + 2 = 3\n4 + 5 = ", "9", "4", "5"), pair("Q: 7 plus 12? A: ", "19", "7", "12")]
    assert largest_number(pairs) == 19
    numbers = number_token_ids(tokenizer, pairs, max_number=largest_number(pairs))
    for role in ("A", "B", "C"):
        assert numbers[role].tolist() == list(range(ord("0"), ord("9") + 1))


def test_prompts_without_operands_are_refused() -> None:
    tokenizer = make_tiny_tokenizer()
    with pytest.raises(DataError, match="fields a and b"):
        operand_token_ids(tokenizer, [PromptPair("4 + 5 = ", "4 @ 5 = ", "9")])
