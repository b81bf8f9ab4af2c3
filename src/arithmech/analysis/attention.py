"""Where key heads look from END: attention mass by token role, and operand / operator head labels.

Background
    A head's attention pattern A[q, k] says how much the query at position q reads from key position k. The
    answer is predicted at END (the prompt's last token), so the row that matters is A[END, :]: which tokens
    the head moves into the END residual. Zhang et al. (2024) average this row over the reference prompts and
    find two kinds of key heads: operand heads, whose END row lands on the numbers A and B, and operator
    heads, whose END row lands on "+", "plus", "-", ... (section 4.2, Figure 5; single prompts in Figure 7).

Formula, per head (l, h), prompt i and role r in ROLES = (A, B, operator, prefix, other)
    end_rows[i, l, h, :] = softmax(q_END . K^T / sqrt(d_head) + mask)         [batch, layer, head, pos]
    mass[i, l, h, r]     = sum_{k : role[i, k] = r, mask[i, k] = 1} end_rows[i, l, h, k]
    score[l, h, r]       = mean_i mass[i, l, h, r]                              [layer, head, role]
    The five masses of a prompt sum to 1 (every real token has exactly one role; END itself is "other").

Labels (`label_heads`): operand head, operator head or neither, from score[A] + score[B] and
    score[operator] against a threshold tau (default 0.3): the rule of `analysis/head_labels.py`.

How the pattern is read
    The weights are the second output of the family's attention module (`ArchSpec.attn`) under transformers'
    eager attention, which returns per-query-head weights [batch, head, q, k] also for grouped-query and
    multi-query attention (keys are repeated per group before the softmax). SDPA and flash attention return
    None, so `eager_attention` switches the model to eager for the duration and puts the original back.
    Only the END row of each captured layer is kept, so memory grows with prompt length, not its square, and
    the forward pass stops once the last requested layer has run.
    `output_attentions=True` is not used: transformers 5 implements it with its own module hooks.

Usage
    >>> rows = end_attention(view, t.ref_ids, t.ref_mask, t.end, layers=[14, 18])  # [batch, 2, head, pos]
    >>> scores = role_scores(rows, t.roles, t.ref_mask)                            # [2, head, role]
    >>> label_heads(scores[0])                                                     # ["operand", ...]

References: Zhang et al., ICML 2024, section 4.2 and 5.2, Figures 5 and 7; METHODS.md section 4.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from arithmech.analysis.head_labels import DEFAULT_TAU, label_head
from arithmech.data.tokens import ROLE_CODES
from arithmech.errors import SpecError
from arithmech.models.hooks import hooks
from arithmech.models.view import ModelView

ROLES: tuple[str, ...] = ("A", "B", "operator", "prefix", "other")
"""Role order of the last axis of `role_scores`."""


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[str]:
    """Run the block with transformers' eager attention (which returns weights); restore the original after.

    Yields the implementation that was set before. A model already on eager is left untouched.
    """
    config: Any = model.config
    original = config._attn_implementation
    if original == "eager":
        yield original
        return
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter("eager")
    else:
        config._attn_implementation = "eager"
    try:
        yield original
    finally:
        if callable(setter):
            setter(original)
        else:
            config._attn_implementation = original


@torch.no_grad()
def end_attention(
    view: ModelView,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    end: torch.Tensor,
    layers: Sequence[int],
    batch_size: int = 16,
    progress: Callable[[int], Any] | None = None,
) -> torch.Tensor:
    """END row of the attention pattern of every head of `layers`, on right-padded prompts.

    input_ids, attention_mask: [batch, pos]; end: [batch] index of each prompt's last token.
    Returns float32 on CPU, [batch, len(layers), head, pos]: row i sums to 1 over positions 0..end[i] and is
    0 after END (right padding included). `progress(n)` is called after each chunk of n prompts.
    """
    layers = list(layers)
    n_heads = view.dims.n_heads
    batch, width = input_ids.shape
    out = torch.zeros(batch, len(layers), n_heads, width)  # [batch, layer, head, pos]
    device = view.o_proj(0).weight.device
    for start in range(0, batch, batch_size):
        rows = slice(start, start + batch_size)
        chunk_end = end[rows]
        chunk_width = int(chunk_end.max()) + 1
        captured = _capture_end_rows(
            view, input_ids[rows, :chunk_width].to(device), attention_mask[rows, :chunk_width].to(device),
            chunk_end, layers,
        )  # [chunk, layer, head, chunk_width]
        out[rows, :, :, :chunk_width] = captured
        if progress is not None:
            progress(int(chunk_end.shape[0]))
    keep = attention_mask[:, None, None, :].to(out.dtype)  # [batch, 1, 1, pos]
    return out * keep


class _StopForward(Exception):
    """Raised by the hook of the last needed layer: later layers and the unembedding need not run."""


def _capture_end_rows(
    view: ModelView, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor, layers: list[int]
) -> torch.Tensor:
    """END rows [batch, layer, head, pos] (float32, CPU) from one forward pass cut after the last layer."""
    slots: dict[int, torch.Tensor] = {}

    def grab(layer: int) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def fn(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise SpecError(
                    f"the attention module of layer {layer} returned no attention weights even with eager "
                    f"attention; check the {view.spec.name!r} spec's attn path"
                )
            if weights.shape[1] != view.dims.n_heads:
                raise SpecError(
                    f"layer {layer} returned weights for {weights.shape[1]} heads, not {view.dims.n_heads}; "
                    f"check the {view.spec.name!r} spec"
                )
            index = torch.arange(weights.shape[0], device=weights.device)
            row = weights[index, :, end.to(weights.device), :]  # [batch, head, k]
            slots[layer] = row.detach().float().cpu()
            if len(slots) == len(set(layers)):
                raise _StopForward

        return fn

    post = [(view.attn(layer), grab(layer)) for layer in set(layers)]
    try:
        with eager_attention(view.model), hooks(post=post):
            view.model(input_ids=ids, attention_mask=mask, use_cache=False)
    except _StopForward:
        pass
    missing = [layer for layer in layers if layer not in slots]
    if missing:
        raise SpecError(f"the attention modules of layers {missing} did not run; check the spec's attn path")
    return torch.stack([slots[layer] for layer in layers], dim=1)  # [batch, layer, head, k]


def role_masses(end_rows: torch.Tensor, roles: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention mass per role of each prompt: end_rows [batch, ..., pos] -> [batch, ..., role].

    roles: [batch, pos] ROLE_CODES; mask: [batch, pos], 1 = real token. Roles in `ROLES` order.
    """
    real = mask.to(torch.bool)
    one_hot = torch.stack([(roles == ROLE_CODES[r]) & real for r in ROLES], dim=-1)  # [batch, pos, role]
    flat = end_rows.reshape(end_rows.shape[0], -1, end_rows.shape[-1])  # [batch, rest, pos]
    masses = torch.einsum("bxp,bpr->bxr", flat.float(), one_hot.float())  # [batch, rest, role]
    return masses.reshape(*end_rows.shape[:-1], len(ROLES))  # [batch, ..., role]


def operand_token_masses(
    end_rows: torch.Tensor, roles: torch.Tensor, mask: torch.Tensor, tokens: int = 2
) -> torch.Tensor:
    """Attention mass on each of the last `tokens` tokens of operands A and B: end_rows [batch, ..., pos] ->
    [batch, ..., 2 * tokens], columns `operand_token_names(tokens)` (A's k-th token from the right, then B's; on
    a digit-splitting tokenizer A[-1] is A's units digit, A[-2] its tens). An operand of fewer tokens puts 0 in
    the others."""
    real = mask.to(torch.bool)
    columns = []
    for role in ("A", "B"):
        is_role = (roles == ROLE_CODES[role]) & real  # [batch, pos]
        from_right = is_role.flip(-1).long().cumsum(-1).flip(-1)  # [batch, pos] 1 at the operand's last token
        columns += [is_role & (from_right == k) for k in range(tokens, 0, -1)]
    one_hot = torch.stack(columns, dim=-1)  # [batch, pos, column]
    flat = end_rows.reshape(end_rows.shape[0], -1, end_rows.shape[-1])  # [batch, rest, pos]
    masses = torch.einsum("bxp,bpc->bxc", flat.float(), one_hot.float())
    return masses.reshape(*end_rows.shape[:-1], one_hot.shape[-1])


def operand_token_names(tokens: int = 2) -> list[str]:
    """Column names of `operand_token_masses`: A[-2], A[-1], B[-2], B[-1] for tokens = 2."""
    return [f"{role}[-{k}]" for role in ("A", "B") for k in range(tokens, 0, -1)]


def role_scores(end_rows: torch.Tensor, roles: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over prompts of `role_masses`: end_rows [batch, ..., pos] -> [..., role]."""
    return role_masses(end_rows, roles, mask).mean(dim=0)


def label_heads(scores: torch.Tensor, tau: float = DEFAULT_TAU) -> list[str]:
    """`label_head` for each row of scores [n, role] (roles in `ROLES` order)."""
    return [label_head(dict(zip(ROLES, row, strict=True)), tau) for row in scores.tolist()]
