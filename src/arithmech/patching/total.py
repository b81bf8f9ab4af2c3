"""The `total` variant of path patching: activation patching of each sender at END, nothing frozen.

Background
    Replacing a sender's END output changes END's own computation only (causal attention: earlier positions
    never see END), and only from the sender's layer up. So the patched logit of sender s at layer l is one
    decoding step of the END token on the reference prompt's cached keys/values (positions before END),
    started at layer l + 1 from END's residual with s patched.

Formula, per sender s at layer l and one prompt (all at END; `path.sender_resid`), C its answer token:
    head s:   x_{l+1}(s) = mid + MLP_l(mid),  mid = x_l + attn_l + (z_cf - z_ref)[s] W_O[s]
    MLP s:    x_{l+1}(s) = x_{l+1} + mlp_cf_l - mlp_ref_l
    logit(s) = W_U[C] . norm(layers l+1 .. L-1 applied to x_{l+1}(s), each attending to the reference cache)
    (parallel-residual families add attention and MLP to x_l side by side); x, attn, mlp and z are read from
    the reference and counterfactual passes (`states.collect_end_states`).

How it is computed
    Every sender joins one batched decoding step of its prompts at its own layer, as a slot of END's position
    that sees the cached prompt and itself (`models/from_layer.decode_from_layers`), `max_rows` (sender,
    prompt) pairs at a time; prompts are grouped by length so their caches need no padding. The caches are
    indexed out of the reference pass's (`keep_cache`) once per group and read once per prompt and layer,
    never copied per sender. The answer logit is read from the answer's unembedding row alone
    (`ModelView.answer_logits`).
    Cost per prompt: sum over senders of (L - 1 - l) single-token layers, about (H + 1) L^2 / 2, plus one MLP
    application per head sender; the two passes that make the states come on top.

Usage
    >>> patched = total_patched_logits(view, batch, ref, cf)  # [component, batch] answer logits

References: Zhang et al., ICML 2024, sec. 4.1 (activation patching at END); METHODS.md sec. 2.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from arithmech.models.from_layer import decode_from_layers
from arithmech.models.shared_prefix import prefix_cache
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch, attention_resid, sender_resid
from arithmech.patching.scan_cost import TOTAL_MAX_ROWS
from arithmech.patching.states import EndStates

Read = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@torch.no_grad()
def total_patched_logits(
    view: ModelView,
    batch: PatchingBatch,
    ref: EndStates,
    cf: EndStates,
    max_rows: int = TOTAL_MAX_ROWS,
    read: Read | None = None,
    whole_layers: bool = False,
) -> torch.Tensor:
    """Answer logits [component, batch] with one sender's END output from `cf` at a time.

    `ref` must come from `collect_end_states(..., keep_cache=True)`. `read(logits [row, d_vocab],
    answers [row]) -> [row]` reads something else instead (e.g. the answer's probability, which needs the
    whole vocabulary); `cf` may hold any replacement values (zeros give END-only zero ablation). Both are read
    from the residual entering the final norm through the view's float32 readout, as the reference is.
    With `whole_layers`, the senders are the attention layers, every head of one layer at once: [layer, batch].
    """
    dims = view.dims
    layers = range(dims.n_layers)
    if whole_layers:
        resid = torch.stack([attention_resid(view, ref, cf, layer) for layer in layers])  # [layer, batch, d]
        join = torch.arange(1, dims.n_layers + 1)  # [sender] the layer it enters
    else:
        resid = torch.cat([sender_resid(view, ref, cf, layer, recompute_mlp=True) for layer in layers])
        join = torch.arange(1, dims.n_layers + 1).repeat_interleave(dims.n_heads + 1)
    return patched_end_logits(view, batch, ref, resid, join, max_rows, read)


@torch.no_grad()
def patched_end_logits(
    view: ModelView,
    batch: PatchingBatch,
    ref: EndStates,
    resid: torch.Tensor,
    join: torch.Tensor,
    max_rows: int = TOTAL_MAX_ROWS,
    read: Read | None = None,
) -> torch.Tensor:
    """Answer logits [sender, batch] of END residuals resid [sender, batch, d_model] entering layers `join`
    [sender] (non-decreasing; n_layers = the final norm), each run through the later layers on its prompt's
    reference cache."""
    if ref.cache is None:
        raise ValueError("the reference states must keep their cache: collect_end_states(..., keep_cache=True)")
    out = torch.empty(len(join), len(batch), device=ref.resid_pre.device)
    for end in batch.end.unique().tolist():
        prompts = (batch.end == end).nonzero().flatten()  # prompts of this length
        prefix = prefix_cache(view, ref.cache, prompts, end) if end > 0 else None
        last = batch.ref_ids[prompts, end][:, None]  # [group, 1]: the END token
        answers = batch.answer_ids[prompts]
        step = max(1, max_rows // len(prompts))  # senders per decoding step
        for start in range(0, len(join), step):
            senders = slice(start, start + step)
            slots = resid[senders, prompts.to(resid.device)].transpose(0, 1)  # [group, sender, d_model]
            final = decode_from_layers(view, join[senders], slots, last, prefix).transpose(0, 1)  # [sender, group, d]
            if read is None:
                value = view.answer_logits(final, answers)  # [sender, group]
            else:
                logits = view.vocab_logits(final)  # [sender, group, d_vocab]
                value = torch.stack([read(row, answers.to(row.device)) for row in logits])
            out[senders, prompts.to(out.device)] = value.float().to(out.device)
    return out
