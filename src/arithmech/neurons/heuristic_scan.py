"""Every MLP neuron over an operand grid at once: activation, direct effect on the answer, and ablation.

Background
    Nikankin et al. (ICLR 2025) describe each MLP neuron by its activation over all operand pairs and by what
    it writes towards the answer, and validate the neurons that matter per prompt by ablating them. Both are
    one batched pass here: hooks read every neuron of every chosen layer at once, never one neuron at a time.

Activation and direct effect (`scan_neurons`)
    For prompt p with answer token c_p, layer l and neuron k, at END (`coefficients.py`, `log_increase.py`):

        m[p, l, k]  = the input of layer l's down projection at END (the activation coefficient)
        DE[p, l, k] = m[p, l, k] * W_U[c_p] . (g * c(q_l * W_down[:, k])) / (s_p * t_{p, l})

    g the final norm's gain, c() its mean-centering (LayerNorm; identity for RMSNorm), s_p its scale at END in
    the intact run, held fixed (`models/readout.FixedNorm`); q_l and t_{p, l} the gain and scale of Gemma 2/3's
    post-MLP norm (1 without one). DE is the neuron's part of the answer's logit before the soft-cap and
    without the unembedding bias; summed over the neurons, plus the down projection's bias read the same way,
    it is exactly the MLP's own contribution to that logit with the scales fixed (tested). One forward pass
    per batch of prompts gives m, the scales and the model's top token (for "answered correctly").

Ablation (`ablation_sweep`)
    Per prompt, per chosen layer: the k neurons with the largest DE on that prompt's answer ("top"), or k
    neurons drawn at random from the same layer ("random", one draw per prompt and seed), have m replaced at
    END by their mean over the prompts of the set ("mean") or by 0 ("zero"); k neurons in every chosen layer
    at once. Accuracy = top token at END is the answer. An ablation at END cannot change any earlier position,
    so the few-shot prefix that every grid prompt shares runs once, each prompt's query tokens before END once
    per pass (on the prefix's keys and values), and every (configuration, prompt) row runs only the END token
    on its prompt's cache, all configurations of a prompt in one batch: one token per row instead of the whole
    prompt (`models/shared_prefix.py`; the replacement at END is `models/end_value.py`'s).

Shapes
    scan_neurons(view, batch, layers)                       NeuronScan: [prompt, layer, d_mlp] maps, [prompt]
    ablation_sweep(view, batch, de, mean_m, layers, ks)     list of rows (ablation, selection, seed, k, ...)

References: Nikankin et al., ICLR 2025 (arXiv 2410.21272), sec. 3-5; METHODS.md (heuristic neurons).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from arithmech.data.tokens import TokenizedPairs
from arithmech.models.end_value import input_at_end
from arithmech.models.hooks import hooks
from arithmech.models.readout import final_norm
from arithmech.models.shared_prefix import SharedPrefix, common_prefix_length
from arithmech.models.view import ModelView
from arithmech.neurons.coefficients import d_mlp
from arithmech.neurons.log_increase import end_states, neuron_directions, predictions, run_scales

ABLATIONS: tuple[str, ...] = ("mean", "zero")


@dataclass(frozen=True)
class NeuronScan:
    """Every neuron of `layers` at each prompt's END (index i of the layer axis = layers[i])."""

    layers: tuple[int, ...]
    activation: torch.Tensor  # [prompt, layer, d_mlp] m
    direct_effect: torch.Tensor  # [prompt, layer, d_mlp] DE on the prompt's answer logit
    top_token: torch.Tensor  # [prompt]

    def correct(self, answers: torch.Tensor) -> torch.Tensor:
        return self.top_token == answers.cpu()


@torch.no_grad()
def scan_neurons(
    view: ModelView, batch: TokenizedPairs, layers: Sequence[int], batch_size: int = 32,
    progress: Callable[[int], Any] | None = None,
) -> NeuronScan:  # fmt: skip
    """m and DE of every neuron of `layers` on every prompt of `batch`; one forward pass per batch_size prompts."""
    layers = tuple(int(layer) for layer in layers)
    norm = final_norm(view)
    w_u = view.unembed.weight.detach()  # [d_vocab, d_model]: only the answers' rows are cast, a chunk's at a time
    directions = [neuron_directions(view, layer, norm) for layer in layers]  # each [d_mlp, d_model]
    acts, effects, tops = [], [], []
    for start in range(0, len(batch.end), batch_size):
        chunk = batch.take(list(range(start, min(start + batch_size, len(batch.end)))))
        states = end_states(view, chunk, layers)
        scales = run_scales(view, states)
        u = w_u[chunk.answer_ids.to(w_u.device)].to(norm.gain.dtype)  # [row, d_model]
        per_layer = []
        for i, direction in enumerate(directions):
            logit = u @ direction.to(u.device).T  # [row, d_mlp]: W_U[c] . g c(q W_down[:, k])
            scale = (scales.final.to(u.device) * scales.mlp_post[:, i].to(u.device))[:, None]  # [row, 1]
            per_layer.append(states.coeff[:, i].to(u.device) * logit / scale)
        acts.append(states.coeff.float().cpu())
        effects.append(torch.stack(per_layer, dim=1).float().cpu())  # [row, layer, d_mlp]
        tops.append(predictions(view, states))
        if progress is not None:
            progress(len(chunk.end))
    return NeuronScan(layers, torch.cat(acts), torch.cat(effects), torch.cat(tops))


@dataclass(frozen=True)
class _Config:
    ablation: str
    selection: str  # "top" or "random"
    seed: int | None
    k: int


@torch.no_grad()
def ablation_sweep(
    view: ModelView,
    batch: TokenizedPairs,
    direct_effect: torch.Tensor,
    mean_activation: torch.Tensor,
    layers: Sequence[int],
    ks: Sequence[int],
    n_random: int = 3,
    seed: int = 0,
    ablations: Sequence[str] = ABLATIONS,
    batch_size: int = 64,
    progress: Callable[[int], Any] | None = None,
) -> list[dict[str, Any]]:
    """Accuracy and mean answer probability after each ablation of the module docstring (k = 0 first).

    direct_effect [prompt, layer, d_mlp] ranks the neurons; mean_activation [layer, d_mlp] is the mean source.
    """
    layers = tuple(int(layer) for layer in layers)
    n_prompts, _, width = direct_effect.shape
    ranks = [_ranks(direct_effect.double().neg().argsort(dim=-1, stable=True))]  # [prompt, layer, d_mlp]: 0 = top
    for r in range(n_random):
        gen = torch.Generator().manual_seed(seed * 1000 + r)
        ranks.append(_ranks(torch.rand(direct_effect.shape, generator=gen).argsort(dim=-1)))
    configs = [_Config("none", "none", None, 0)] + [
        _Config(ablation, selection, r if selection == "random" else None, int(k))
        for ablation in ablations for k in ks
        for selection, r in [("top", 0), *(("random", r + 1) for r in range(n_random))]
    ]  # fmt: skip
    values = {"mean": mean_activation.float(), "zero": torch.zeros(len(layers), width)}
    correct = torch.zeros(len(configs), n_prompts, dtype=torch.bool)
    prob = torch.zeros(len(configs), n_prompts)
    per_pass = max(1, batch_size // len(configs))  # prompts per forward pass, all their configurations as rows
    step = _EndStep(view, batch)
    for length in batch.end.unique().tolist():  # prompts of one length share a cache shape
        group = (batch.end == length).nonzero().flatten()
        for start in range(0, len(group), per_pass):
            prompts = group[start : start + per_pass]
            prompt = prompts.repeat_interleave(len(configs))  # [row]: prompt-major, configurations inner
            config = torch.arange(len(configs)).repeat(len(prompts))  # [row]
            masks, sources = _row_masks([configs[c] for c in config.tolist()], prompt, ranks, values, len(layers),
                                        width)  # fmt: skip
            at_end = torch.zeros(len(prompt), dtype=torch.long)  # END is the only position of each row
            pre = [(view.down_proj(layer), input_at_end(masks[:, i], sources[:, i], at_end))
                   for i, layer in enumerate(layers) if bool(masks[:, i].any())]  # fmt: skip
            before_end = step.before_end(prompts, int(length))  # the tokens before END, unablated
            with hooks(pre=pre):
                logits = step.logits(before_end, prompts, int(length), len(configs))  # [row, d_vocab]
            answers = batch.answer_ids[prompt].to(logits.device)
            correct[config, prompt] = (logits.argmax(-1) == answers).cpu()
            prob[config, prompt] = logits.softmax(-1).gather(1, answers[:, None])[:, 0].cpu()
            if progress is not None:
                progress(len(prompt))
    return [{"ablation": c.ablation, "selection": c.selection, "seed": c.seed, "k": c.k,
             "accuracy": float(correct[i].float().mean()), "answer_prob": float(prob[i].mean())}
            for i, c in enumerate(configs)]  # fmt: skip


class _EndStep:
    """The END-token rows of an ablation: the prompts' shared prefix runs once; per pass, each prompt's tokens
    between the prefix and END run on it (`before_end`), and `logits()` runs only the END token of each
    (prompt, copy) row on its prompt's cache (`models/shared_prefix.py`)."""

    def __init__(self, view: ModelView, batch: TokenizedPairs) -> None:
        self.view, self.batch = view, batch
        self.p = common_prefix_length(batch.ref_ids, batch.end)
        self.prefix = SharedPrefix.of_tokens(view, batch.ref_ids[0, : self.p])

    def before_end(self, prompts: torch.Tensor, end: int) -> SharedPrefix:
        """The run of `prompts` (all with END at `end`, so no padding before it) up to the token before END."""
        between = self.batch.ref_ids[prompts, self.p : end]  # [prompt, end - p]
        return self.prefix.extended(between, torch.zeros(len(prompts), dtype=torch.long))

    def logits(self, before_end: SharedPrefix, prompts: torch.Tensor, end: int, copies: int) -> torch.Tensor:
        """[prompt * copies, d_vocab] at END, prompt-major, read out as `ModelView.end_logits` does."""
        rows = torch.arange(len(prompts)).repeat_interleave(copies)  # [row]: the prompt of each row
        last = self.batch.ref_ids[prompts, end : end + 1][rows]  # [row, 1]: the END token
        resid = before_end.final_resid(last, torch.ones_like(last), rows)  # [row, 1, d_model]
        return self.view.vocab_logits(resid[:, -1]).float()


def _ranks(order: torch.Tensor) -> torch.Tensor:
    """Rank of every neuron [prompt, layer, d_mlp] given the neurons in rank order (argsort's output)."""
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(order.shape[-1]).expand_as(order).contiguous())
    return ranks


def _row_masks(
    configs: list[_Config], prompt: torch.Tensor, ranks: list[torch.Tensor], values: dict[str, torch.Tensor],
    n_layers: int, width: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per row: which neurons are replaced [row, layer, d_mlp] and by what [row, layer, d_mlp]."""
    masks = torch.zeros(len(configs), n_layers, width, dtype=torch.bool)
    sources = torch.zeros(len(configs), n_layers, width)
    for row, (c, p) in enumerate(zip(configs, prompt.tolist(), strict=True)):
        if c.k == 0:
            continue
        masks[row] = ranks[c.seed or 0][p] < c.k
        sources[row] = values[c.ablation]
    return masks, sources


def check_width(view: ModelView, layers: Sequence[int]) -> int:
    """The common number of neurons of `layers` (every supported family has one width)."""
    widths = {d_mlp(view, layer) for layer in layers}
    assert len(widths) == 1, widths
    return widths.pop()
