"""END-row attention: equal to a hand recomputation from q and k, grouped correctly by token role, labelled
by the documented rule, and read also from models loaded with SDPA, leaving no hooks or settings behind."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from arithmech.analysis.attention import (
    ROLES,
    eager_attention,
    end_attention,
    label_heads,
    operand_token_masses,
    operand_token_names,
    role_masses,
    role_scores,
)
from arithmech.analysis.head_labels import label_head
from arithmech.data import PromptPair, tokenize_pairs
from arithmech.data.tokens import ROLE_CODES
from arithmech.errors import SpecError
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks, hooks
from arithmech.models.load import ModelConfig, load_model
from arithmech.models.view import ModelView

from tiny_models import TINY_ARCHS, make_tiny_model

PROMPTS = ["12+34=", "7+8=", "1 plus 2 is "]  # different lengths: right padding is exercised


def view_of(arch: str) -> ModelView:
    model = make_tiny_model(arch)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def batch(tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask, enc.attention_mask.sum(1) - 1


def hand_end_rows(view: ModelView, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """softmax(q_END . K^T / sqrt(d_head)) from the q/k projections of each layer's normed input, by hand.

    Llama: rotary on q and k, each kv head repeated for its group of query heads. GPT-2: fused c_attn.
    Returns [batch, layer, head, pos], zero on keys after END and on padding.
    """
    d = view.dims
    normed: dict[int, torch.Tensor] = {}

    def keep(layer: int):
        def fn(_module, _args, output):
            normed[layer] = output.detach()

        return fn

    with hooks(post=[(view.attn_norm(layer), keep(layer)) for layer in range(d.n_layers)]):
        with torch.no_grad():
            view.model(input_ids=ids, attention_mask=mask, use_cache=False)
    b, p = ids.shape
    rows = []
    for layer in range(d.n_layers):
        h = normed[layer]  # [batch, pos, d_model]
        if view.spec.name == "gpt2":
            q, k, _ = view.module(layer, "attn.c_attn")(h).split(d.n_heads * d.d_head, dim=2)
            q = q.view(b, p, d.n_heads, d.d_head).transpose(1, 2)  # [batch, head, pos, d_head]
            k = k.view(b, p, d.n_heads, d.d_head).transpose(1, 2)  # [batch, head, pos, d_head]
        else:
            q = view.module(layer, "self_attn.q_proj")(h).view(b, p, d.n_heads, d.d_head).transpose(1, 2)
            k = view.module(layer, "self_attn.k_proj")(h).view(b, p, d.n_kv_heads, d.d_head).transpose(1, 2)
            cos, sin = view.model.model.rotary_emb(h, torch.arange(p)[None])
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k = k.repeat_interleave(d.group_size, dim=1)  # [batch, head, pos, d_head]: kv head h // group
        scores = q @ k.transpose(-1, -2) / math.sqrt(d.d_head)  # [batch, head, q, k]
        allowed = torch.ones(p, p).tril().bool()[None, None] & mask.bool()[:, None, None, :]
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        rows.append(probs[torch.arange(b), :, end])  # [batch, head, k]
    return torch.stack(rows, dim=1) * mask[:, None, None, :]


@pytest.mark.parametrize("arch", ["llama", "llama-mqa", "gpt2"])
def test_end_rows_equal_hand_recomputation(arch: str, tiny_tokenizer) -> None:
    view = view_of(arch)
    ids, mask, end = batch(tiny_tokenizer)
    rows = end_attention(view, ids, mask, end, layers=range(view.dims.n_layers), batch_size=2)
    assert rows.shape == (len(PROMPTS), view.dims.n_layers, view.dims.n_heads, ids.shape[1])
    torch.testing.assert_close(rows, hand_end_rows(view, ids, mask, end), atol=1e-5, rtol=1e-4)
    for i, e in enumerate(end.tolist()):
        torch.testing.assert_close(rows[i, :, :, : e + 1].sum(-1), torch.ones(rows.shape[1:3]))
        assert rows[i, :, :, e + 1 :].abs().sum() == 0  # right padding (and anything after END) gets none
    if view.dims.n_kv_heads < view.dims.n_heads:  # grouped heads share keys but not queries
        assert not torch.allclose(rows[:, :, 0], rows[:, :, 1])


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_end_rows_equal_eager_weights_every_arch(arch: str, tiny_tokenizer) -> None:
    view = view_of(arch)
    ids, mask, end = batch(tiny_tokenizer)
    layers = [view.dims.n_layers - 1, 0]  # any order, any subset
    rows = end_attention(view, ids, mask, end, layers=layers)
    assert count_hooks(view.model) == 0
    with torch.no_grad():  # last use of this model: output_attentions leaves transformers' own hooks on it
        full = view.model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    expected = torch.stack([full[layer][torch.arange(len(PROMPTS)), :, end] for layer in layers], dim=1)
    torch.testing.assert_close(rows, expected * mask[:, None, None, :], atol=1e-6, rtol=1e-5)


def test_forward_stops_after_the_last_requested_layer(tiny_tokenizer) -> None:
    view = view_of("llama")
    ids, mask, end = batch(tiny_tokenizer)
    calls: list[int] = []
    last = view.dims.n_layers - 1
    spies = [
        (view.attn(last), lambda m, a, o: calls.append(last)),
        (view.final_norm, lambda m, a, o: calls.append(-1)),
    ]
    with hooks(post=spies):
        end_attention(view, ids, mask, end, layers=[1, 0, 1])
        assert calls == []
        end_attention(view, ids, mask, end, layers=[last])
    assert calls == [last]  # the last layer ran, the final norm did not


def test_sdpa_model_is_read_with_eager_and_restored(tiny_model_dir, tiny_tokenizer) -> None:
    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama-mqa")), attn_implementation="sdpa"))
    model = handle.model
    assert model.config._attn_implementation == "sdpa"
    ids, mask, end = batch(tiny_tokenizer)
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
    rows = end_attention(handle.view, ids, mask, end, layers=[0, 1])
    assert model.config._attn_implementation == "sdpa"
    assert count_hooks(model) == 0
    eager = end_attention(view_of("llama-mqa"), ids, mask, end, layers=[0, 1])
    torch.testing.assert_close(rows, eager, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        after = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(after, before)


def test_nothing_left_behind_when_the_forward_raises(tiny_model_dir, tiny_tokenizer) -> None:
    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama")), attn_implementation="sdpa"))
    ids, mask, _ = batch(tiny_tokenizer)
    beyond = torch.full((len(PROMPTS),), 50)  # an END past the prompt: the hook's indexing fails mid-forward
    with pytest.raises(IndexError):
        end_attention(handle.view, ids, mask, beyond, layers=[0])
    assert count_hooks(handle.model) == 0
    assert handle.model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="boom"):
        with eager_attention(handle.model) as original:
            assert original == "sdpa" and handle.model.config._attn_implementation == "eager"
            raise RuntimeError("boom")
    assert handle.model.config._attn_implementation == "sdpa"


def test_attn_path_without_weights_is_a_spec_error(tiny_tokenizer) -> None:
    model = make_tiny_model("llama")
    missing = dataclasses.replace(spec_for_model_type("llama"), attn="attention")
    with pytest.raises(SpecError, match="does not match the 'llama' spec"):
        ModelView(model, missing)  # the path is checked when the view is made
    wrong = dataclasses.replace(spec_for_model_type("llama"), attn="self_attn.o_proj")  # returns a tensor
    ids, mask, end = batch(tiny_tokenizer)
    with pytest.raises(SpecError, match="returned no attention weights"):
        end_attention(ModelView(model, wrong), ids, mask, end, layers=[0])
    assert count_hooks(model) == 0


# -- role grouping -------------------------------------------------------------------------------------
def test_role_masses_on_a_known_row() -> None:
    roles = torch.tensor([[4, 4, 1, 3, 2, 0, 0, 0]])  # prefix prefix A op B END pad pad
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    row = torch.tensor([[0.1, 0.1, 0.3, 0.2, 0.15, 0.15, 0.5, 0.5]])  # pad weights must be ignored
    masses = role_masses(row, roles, mask)
    expected = {"A": 0.3, "B": 0.15, "operator": 0.2, "prefix": 0.2, "other": 0.15}
    torch.testing.assert_close(masses[0], torch.tensor([expected[r] for r in ROLES]))


def test_role_scores_average_prompts_and_keep_head_axes() -> None:
    roles = torch.tensor([[1, 2, 3, 0], [1, 2, 3, 0]])
    mask = torch.ones(2, 4, dtype=torch.long)
    rows = torch.zeros(2, 3, 2, 4)  # [batch, layer, head, pos]
    rows[0, :, :, 0] = 1.0  # prompt 0: all on A
    rows[1, :, :, 2] = 1.0  # prompt 1: all on the operator
    scores = role_scores(rows, roles, mask)
    assert scores.shape == (3, 2, len(ROLES))
    assert torch.all(scores[..., ROLES.index("A")] == 0.5)
    assert torch.all(scores[..., ROLES.index("operator")] == 0.5)
    torch.testing.assert_close(scores.sum(-1), torch.ones(3, 2))


def test_roles_from_tokenize_pairs_put_mass_where_expected(tiny_tokenizer) -> None:
    reference = "1+2=3\n4+5="  # byte tokenizer: one token per character
    pair = PromptPair(
        reference, "1+2=3\n4@5=", "9",
        spans={"prefix": (0, 6), "A": (6, 7), "operator": (7, 8), "B": (8, 9)},
    )  # fmt: skip
    other = PromptPair("7+1=", "7@1=", "8", spans={"A": (0, 1), "operator": (1, 2), "B": (2, 3)})
    t, _ = tokenize_pairs(tiny_tokenizer, [pair, other])
    assert t.roles_available
    assert t.roles[0].tolist() == [ROLE_CODES[r] for r in ["prefix"] * 6 + ["A", "operator", "B", "other"]]
    rows = torch.zeros(2, t.ref_ids.shape[1])
    rows[0, [6, 7, 9]] = torch.tensor([0.5, 0.25, 0.25])  # A, "+", END "="
    rows[1, [0, 2, 3]] = torch.tensor([0.25, 0.5, 0.25])  # A, B, END; positions 4.. are padding
    masses = role_masses(rows, t.roles, t.ref_mask)
    named = [dict(zip(ROLES, m.tolist(), strict=True)) for m in masses]
    assert named[0] == pytest.approx({"A": 0.5, "B": 0.0, "operator": 0.25, "prefix": 0.0, "other": 0.25})
    assert named[1] == pytest.approx({"A": 0.25, "B": 0.5, "operator": 0.0, "prefix": 0.0, "other": 0.25})


# -- labelling rule ----------------------------------------------------------------------------------------
LABEL_CASES = [
    ("operands", {"A": 0.2, "B": 0.2, "operator": 0.1}, 0.3, "operand"),
    ("operator", {"A": 0.05, "B": 0.05, "operator": 0.5}, 0.3, "operator"),
    ("spread", {"A": 0.1, "B": 0.1, "operator": 0.2}, 0.3, "neither"),
    ("tie above tau", {"A": 0.2, "B": 0.2, "operator": 0.4}, 0.3, "neither"),
    ("operand at tau", {"A": 0.15, "B": 0.15, "operator": 0.1}, 0.3, "operand"),
    ("operator at tau", {"A": 0.1, "B": 0.1, "operator": 0.3}, 0.3, "operator"),
    ("both pass, operand wins", {"A": 0.3, "B": 0.2, "operator": 0.4}, 0.3, "operand"),
    ("stricter tau", {"A": 0.2, "B": 0.2, "operator": 0.1}, 0.5, "neither"),
]


@pytest.mark.parametrize(("name", "scores", "tau", "label"), LABEL_CASES, ids=[c[0] for c in LABEL_CASES])
def test_label_rule(name: str, scores: dict[str, float], tau: float, label: str) -> None:
    full = {"prefix": 0.0, "other": 0.0, **scores}
    assert label_head(full, tau) == label


def test_label_heads_reads_rows_in_role_order() -> None:
    rows = torch.tensor([[0.4, 0.1, 0.1, 0.3, 0.1], [0.0, 0.0, 0.6, 0.2, 0.2], [0.1, 0.1, 0.1, 0.6, 0.1]])
    assert label_heads(rows) == ["operand", "operator", "neither"]


def test_operand_token_masses_split_each_operand_by_its_tokens_from_the_right() -> None:
    code = ROLE_CODES
    # prefix, A = "2" "7", operator, B = "5" (one token), other (END); one prompt, one padded position
    roles = torch.tensor([[code["prefix"], code["A"], code["A"], code["operator"], code["B"], code["other"], 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    rows = torch.tensor([[[0.1, 0.2, 0.3, 0.05, 0.15, 0.2, 0.9]]])  # [batch, head, pos]; the pad's weight is ignored
    masses = operand_token_masses(rows, roles, mask)  # [batch, head, 4]
    assert operand_token_names() == ["A[-2]", "A[-1]", "B[-2]", "B[-1]"]
    torch.testing.assert_close(masses, torch.tensor([[[0.2, 0.3, 0.0, 0.15]]]))  # tens of A, units of A, -, B
