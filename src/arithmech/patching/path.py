"""Path patching of every attention head and MLP into the logits at END (Zhang et al. 2024, section 4.1).

Background
    For a sender s (head (l, h) or MLP l) and receiver = the answer logit at END, run the reference prompt
    with s's END output taken from the counterfactual prompt, every other head's output frozen to its
    reference value (all positions) and the MLPs recomputed (Wang et al. 2023 semantics; METHODS.md sec. 2).

Formula, per sender s and prompt i (C = first answer token):
    effect(s) = mean_i (logit_patched[i, C] - logit_ref[i, C]) / |logit_ref[i, C]|

Why it is fast
    With every other head frozen and MLPs acting per position, only the END residual changes. So from one
    reference and one counterfactual forward pass (`states.collect_end_states`) the exact patched logit is
    the END residual pushed through the later MLPs (attention adds its frozen reference output), the final
    norm and the answer's unembedding row. All senders of all layers travel together in one sweep over the
    layers: at layer l the new head senders join the batch of perturbed END residuals. Cost: about
    L^2 / 2 x (H + 1) MLP applications to single vectors per prompt, instead of L x (H + 1) full forward
    passes.

Variants
    path    MLPs recomputed, attention frozen (default; the paper's method).
    direct  MLPs frozen too: the sender's change reaches the logits only through the final norm.
    total   nothing frozen (activation patching at END): one decoding step per sender on the reference
            prompt's cached keys/values, all senders batched (`total.py`).

Usage
    >>> result = path_patch(view, batch, variant="path")
    >>> result.effects  # [component] mean relative change of the answer logit

References: Zhang et al., ICML 2024, Algorithm 1; Wang et al., ICLR 2023 (path patching); METHODS.md sec. 2.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from arithmech.models.shared_prefix import SharedPrefix
from arithmech.models.sites import Component, all_components
from arithmech.models.view import ModelView
from arithmech.patching.metrics import relative_change
from arithmech.patching.states import EndStates, collect_end_states
from arithmech.patching.variants import Variant
from arithmech.runs import atomic_open, code_version


@dataclass(frozen=True)
class PatchingBatch:
    """Reference and counterfactual prompts, right-padded, with END and answer token per prompt."""

    ref_ids: torch.Tensor  # [batch, pos]
    ref_mask: torch.Tensor  # [batch, pos]
    cf_ids: torch.Tensor  # [batch, pos]
    cf_mask: torch.Tensor  # [batch, pos]
    end: torch.Tensor  # [batch] index of each prompt's last token
    answer_ids: torch.Tensor  # [batch]

    def __len__(self) -> int:
        return int(self.ref_ids.shape[0])

    def shared_length(self) -> int:
        """Positions at the start where every reference and counterfactual prompt agree (token and mask), at
        most up to the first END: a counterfactual run can take them from the reference run's cache."""
        differs = ((self.ref_ids != self.cf_ids) | (self.ref_mask != self.cf_mask)).any(0)  # [pos]
        first = int(differs.int().argmax()) if bool(differs.any()) else int(differs.shape[0])
        return min(first, int(self.end.min()))

    def select(self, idx: slice | torch.Tensor) -> PatchingBatch:
        """A sub-batch of prompts (a slice, or indices in any order), trimmed to its own longest prompt."""
        end = self.end[idx]
        width = int(end.max()) + 1
        return PatchingBatch(
            self.ref_ids[idx, :width], self.ref_mask[idx, :width], self.cf_ids[idx, :width],
            self.cf_mask[idx, :width], end, self.answer_ids[idx],
        )


@dataclass
class PatchResult:
    """Per-component effects, in `all_components` order, with the numbers behind them."""

    components: list[Component]
    per_prompt: torch.Tensor  # [component, batch] relative change of the answer logit
    ref_logit: torch.Tensor  # [batch] answer logit on the reference prompt
    cf_logit: torch.Tensor  # [batch] answer logit on the counterfactual prompt
    variant: str

    @property
    def effects(self) -> torch.Tensor:
        """[component] mean over prompts."""
        return self.per_prompt.mean(dim=1)

    @property
    def total_effect(self) -> float:
        """Relative change of the answer logit when the whole prompt is the counterfactual."""
        return float(relative_change(self.cf_logit, self.ref_logit).mean())


@torch.no_grad()
def end_logits(view: ModelView, states: EndStates, answer_ids: torch.Tensor) -> torch.Tensor:
    """[batch] answer logits read from the final residual of a forward pass."""
    return view.answer_logits(states.resid_final, answer_ids)


@torch.no_grad()
def sweep_senders(
    view: ModelView, ref: EndStates, cf: EndStates, answer_ids: torch.Tensor, recompute_mlps: bool
) -> torch.Tensor:
    """Patched answer logits [component, batch] of every sender, in one pass over the layers.

    `state` holds one perturbed END residual per (sender so far, prompt): [sender, batch, d_model]. The
    senders of earlier layers see every head frozen; the new senders of each layer join after it.
    """
    dims = view.dims
    batch = ref.resid_pre.shape[1]
    state = ref.resid_pre.new_zeros(0, batch, dims.d_model)  # [sender, batch, d_model]
    for layer in range(dims.n_layers):
        attn_ref = view.attn_resid(layer, ref.attn_out[layer])  # [batch, d_model]
        frozen = _after_block(view, layer, ref, state, attn_ref, recompute_mlps)  # [sender, batch, d_model]
        state = torch.cat([frozen, sender_resid(view, ref, cf, layer, recompute_mlps)])
    return view.answer_logits(state, answer_ids)  # [sender, batch]


def sender_resid(view: ModelView, ref: EndStates, cf: EndStates, layer: int, recompute_mlp: bool) -> torch.Tensor:
    """END residual entering layer + 1 [head + 1, batch, d_model] with one sender of `layer` patched from `cf`.

    Rows: each head (its output changes the attention output by (z_cf - z_ref) W_O[head]), then the MLP (its
    output from `cf`). Nothing below `layer` changes, and the attention's inputs at `layer` do not either.
    With `recompute_mlp` the layer's MLP reads the head sender's residual, else it keeps its reference output.
    """
    w_o = view.W_O(layer).to(ref.z.dtype)  # [head, d_head, d_model]
    dz = view.split_heads(cf.z[layer] - ref.z[layer])  # [batch, head, d_head]
    delta = torch.einsum("bhd,hdm->hbm", dz, w_o)  # [head, batch, d_model]
    attn_new = view.attn_resid(layer, ref.attn_out[layer] + delta)  # [head, batch, d_model]
    x = ref.resid_pre[layer].expand(view.dims.n_heads, -1, -1)  # [head, batch, d_model]
    heads = _after_block(view, layer, ref, x, attn_new, recompute_mlp)
    mlp_ref = _mlp_resid_from_out(view, layer, ref.mlp_out[layer])  # [batch, d_model]
    mlp = ref.resid_pre[layer + 1] + (_mlp_resid_from_out(view, layer, cf.mlp_out[layer]) - mlp_ref)
    return torch.cat([heads, mlp[None]])  # [head + 1, batch, d_model]


def attention_resid(view: ModelView, ref: EndStates, cf: EndStates, layer: int) -> torch.Tensor:
    """END residual entering layer + 1 [batch, d_model] with every head of `layer` from `cf` at once (the MLP
    recomputed): with zeros for `cf`, the layer's attention knocked out at END."""
    delta = view.head_outputs(layer, cf.z[layer] - ref.z[layer]).sum(-2)  # [batch, d_model]
    attn = view.attn_resid(layer, ref.attn_out[layer] + delta.to(ref.attn_out.dtype))
    return _after_block(view, layer, ref, ref.resid_pre[layer], attn, recompute_mlp=True)


def _after_block(
    view: ModelView, layer: int, ref: EndStates, x: torch.Tensor, attn: torch.Tensor, recompute_mlp: bool
) -> torch.Tensor:
    """Residual after `layer` [..., batch, d_model] of END residuals x entering it, given the attention's part."""
    if not recompute_mlp:
        return x + attn + _mlp_resid_from_out(view, layer, ref.mlp_out[layer])
    return block_output(view, layer, x, attn)


def block_output(view: ModelView, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """Residual after `layer` [..., d_model] at one position, from the residual x entering it and what its
    attention adds there (`ModelView.attn_resid`), the MLP recomputed (sequential or parallel block)."""
    if view.parallel_residual:
        return x + attn + view.mlp_resid(layer, x)
    mid = x + attn
    return mid + view.mlp_resid(layer, mid)


def _mlp_resid_from_out(view: ModelView, layer: int, mlp_out: torch.Tensor) -> torch.Tensor:
    norm = view.mlp_out_norm(layer)
    return norm(mlp_out) if norm is not None else mlp_out


@torch.no_grad()
def path_patch(
    view: ModelView,
    batch: PatchingBatch,
    variant: Variant = "path",
    batch_size: int = 32,
    progress: Callable[[int], None] | None = None,
    resume_dir: Path | None = None,
) -> PatchResult:
    """Effect of every head and MLP (METHODS.md sec. 2), prompts processed `batch_size` at a time, in chunks of
    about one length (`length_chunks`); results in the batch's order.

    `progress(n)` is called with the number of prompts finished after each chunk. With `resume_dir`, each
    finished chunk is saved there and a rerun with the same folder loads it instead of recomputing; the
    caller must make the folder name unique to the model, prompts and settings (see `resume_key`).
    """
    parts: list[dict[str, torch.Tensor]] = []
    chunks = length_chunks(batch, batch_size)
    for index, prompts in enumerate(chunks):
        chunk = batch.select(prompts)
        saved = resume_dir / f"chunk-{index:05d}.pt" if resume_dir is not None else None
        if saved is not None and saved.exists():
            part = torch.load(saved)
        else:
            part = _patch_chunk(view, chunk, variant)
            if saved is not None:
                with atomic_open(saved, "wb") as handle:
                    torch.save(part, handle)
        parts.append(part)
        if progress is not None:
            progress(len(chunk))
    order = torch.cat(chunks).argsort()  # each prompt's place among the chunks' prompts
    return PatchResult(
        components=all_components(view.dims),
        per_prompt=torch.cat([p["per_prompt"] for p in parts], dim=1)[:, order],
        ref_logit=torch.cat([p["ref_logit"] for p in parts])[order],
        cf_logit=torch.cat([p["cf_logit"] for p in parts])[order],
        variant=variant,
    )


def length_chunks(batch: PatchingBatch, batch_size: int) -> list[torch.Tensor]:
    """The prompts of each chunk: sorted by length (then by where the pair first differs), at most `batch_size`
    per chunk, and a new chunk wherever the next prompt is more than 1/16 longer than the chunk's first.

    A chunk runs padded to its longest prompt, and its counterfactual pass from the earliest position where one
    of its pairs differs: prompts of about one length (and template) in a chunk waste little of either.
    """
    differs = (batch.ref_ids != batch.cf_ids) | (batch.ref_mask != batch.cf_mask)  # [batch, pos]
    first = torch.where(differs.any(1), differs.int().argmax(1), differs.shape[1])  # [batch]
    order = sorted(range(len(batch)), key=lambda i: (int(batch.end[i]), int(first[i])))
    chunks: list[list[int]] = []
    for i in order:
        chunk = chunks[-1] if chunks else None
        if chunk is None or len(chunk) == batch_size or 16 * int(batch.end[i] + 1) > 17 * int(batch.end[chunk[0]] + 1):
            chunks.append([i])
        else:
            chunk.append(i)
    return [torch.tensor(c, dtype=torch.long) for c in chunks]


def _patch_chunk(view: ModelView, chunk: PatchingBatch, variant: Variant) -> dict[str, torch.Tensor]:
    """Per-prompt effects [component, chunk] and the reference/counterfactual answer logits of one chunk."""
    ref = collect_end_states(view, chunk.ref_ids, chunk.ref_mask, chunk.end, keep_cache=True)
    past = SharedPrefix(view, ref.cache, chunk.shared_length()).past(torch.arange(len(chunk)))  # each its own ref
    cf = collect_end_states(view, chunk.cf_ids, chunk.cf_mask, chunk.end, past=past)
    answers = chunk.answer_ids.to(ref.resid_pre.device)
    ref_logit = end_logits(view, ref, answers)
    if variant == "total":
        from arithmech.patching.total import total_patched_logits

        patched = total_patched_logits(view, chunk, ref, cf)
    else:
        patched = sweep_senders(view, ref, cf, answers, recompute_mlps=(variant == "path"))
    return {
        "per_prompt": relative_change(patched, ref_logit).cpu(),
        "ref_logit": ref_logit.cpu(),
        "cf_logit": end_logits(view, cf, answers).cpu(),
    }


def resume_key(batch: PatchingBatch, variant: str, batch_size: int, model_identity: str) -> str:
    """A short hash naming the saved chunks of one scan: same model, prompts, settings and code (the engine's
    version, `runs.code_version`), same key; chunks of an older engine are not reused."""
    digest = hashlib.sha256(f"{model_identity}|{variant}|{batch_size}|{code_version()}".encode())
    for tensor in (batch.ref_ids, batch.ref_mask, batch.cf_ids, batch.end, batch.answer_ids):
        digest.update(tensor.cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
