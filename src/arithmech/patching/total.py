"""The `total` variant of path patching: activation patching of each sender at END, nothing frozen.

Only END's own computation changes when a sender's END output is replaced, so the patched logits equal one
decoding step of the END token on the reference prompt's cached keys/values (positions before END), with the
sender's END output replaced during that step. All (sender, prompt) rows run as one batch of single-token
decoding steps, `max_rows` at a time; prompts are grouped by length so their caches need no padding.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.view import ModelView, cache_kwarg
from arithmech.patching.states import EndStates

if TYPE_CHECKING:
    from arithmech.patching.path import PatchingBatch


@torch.no_grad()
def total_patched_logits(
    view: ModelView,
    batch: PatchingBatch,
    ref: EndStates,
    cf: EndStates,
    max_rows: int = 512,
    read: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Answer logits [component, batch] with one sender's END output from `cf` at a time.

    `read(logits [row, d_vocab], answers [row]) -> [row]` reads something else instead (e.g. the answer's
    probability); `cf` may hold any replacement values (zeros give END-only zero ablation). Both are read
    from the residual entering the final norm through the view's float32 readout, as the reference is.
    """
    dims = view.dims
    n_senders = dims.n_layers * (dims.n_heads + 1)
    out = torch.empty(n_senders, len(batch), device=ref.resid_pre.device)
    device = view.o_proj(0).weight.device
    for end in batch.end.unique().tolist():
        prompts = (batch.end == end).nonzero().flatten()  # prompts of this length
        cache = None
        if end > 0:
            prefix = view.model(
                input_ids=batch.ref_ids[prompts, :end].to(device),
                attention_mask=batch.ref_mask[prompts, :end].to(device),
                use_cache=True,
            )
            cache = getattr(prefix, "cache", None) or prefix.past_key_values
        last = batch.ref_ids[prompts, end].to(device)  # [group]
        rows = torch.cartesian_prod(torch.arange(n_senders), torch.arange(len(prompts)))  # [(s, p)]
        for start in range(0, len(rows), max_rows):
            block = rows[start : start + max_rows]
            senders, local = block[:, 0], block[:, 1]
            step_cache = None
            if cache is not None:
                step_cache = copy.deepcopy(cache)
                step_cache.batch_select_indices(local.to(device))
            with hooks(**_replace_hooks(view, senders, prompts[local], cf)):
                kwargs = {cache_kwarg(view.model.base_model): step_cache} if step_cache is not None else {}
                resid = view.final_resid(input_ids=last[local][:, None], use_cache=cache is not None, **kwargs)
            resid = resid[:, -1]  # [row, d_model], entering the final norm
            answers = batch.answer_ids[prompts[local]]
            if read is None:  # the same float32 readout as the reference logit (`ModelView.answer_logits`)
                value = view.answer_logits(resid, answers)
            else:
                logits = view.vocab_logits(resid)  # [row, d_vocab]
                value = read(logits, answers.to(logits.device))
            out[senders, prompts[local]] = value.float().to(out.device)
    return out


def _replace_hooks(
    view: ModelView, senders: torch.Tensor, prompts: torch.Tensor, cf: EndStates
) -> dict[str, list[tuple[Any, Any]]]:
    """Hooks that put the counterfactual END value of each row's sender in place during a decoding step."""
    per_layer = view.dims.n_heads + 1
    layer_of, slot = senders // per_layer, senders % per_layer  # slot == n_heads means the MLP
    pre, post = [], []
    for layer in layer_of.unique().tolist():
        in_layer = layer_of == layer
        head_rows = (in_layer & (slot < view.dims.n_heads)).nonzero().flatten()
        mlp_rows = (in_layer & (slot == view.dims.n_heads)).nonzero().flatten()
        if len(head_rows):
            set_heads = _set_heads(view, head_rows, slot[head_rows], prompts[head_rows], cf.z[layer])
            pre.append((view.o_proj(layer), set_heads))
        if len(mlp_rows):
            post.append((view.mlp(layer), _set_mlp(mlp_rows, cf.mlp_out[layer][prompts[mlp_rows]])))
    return {"pre": pre, "post": post}


def _set_heads(
    view: ModelView, rows: torch.Tensor, heads: torch.Tensor, prompts: torch.Tensor, cf_z: torch.Tensor
) -> Any:
    def fn(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        z = args[0].clone()  # [row, 1, head * d_head]
        z_heads = view.split_heads(z)  # [row, 1, head, d_head]
        source = view.split_heads(cf_z.to(z.device))  # [batch, head, d_head]
        r, h, p = rows.to(z.device), heads.to(z.device), prompts.to(z.device)
        z_heads[r, 0, h] = source[p, h].to(z.dtype)
        return (z_heads.reshape(z.shape), *args[1:])

    return fn


def _set_mlp(rows: torch.Tensor, values: torch.Tensor) -> Any:
    def fn(_module: Any, _args: Any, output: Any) -> Any:
        out = first_tensor(output).clone()  # [row, 1, d_model]
        out[rows.to(out.device), 0] = values.to(out.device, out.dtype)
        return (out, *output[1:]) if isinstance(output, tuple) else out

    return fn
