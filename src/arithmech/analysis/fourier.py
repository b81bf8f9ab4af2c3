"""Fourier features of the number tokens: which frequencies each attention and MLP output writes, and what
the model loses when a component group's output is cut along some of them (Zhou et al., NeurIPS 2024).

Background
    Zhou et al. read each layer's output through the unembedding, restricted to the number tokens, and take a
    discrete Fourier transform over the number index n: the spectra are sparse, MLP outputs carry mostly low
    frequencies (the answer's magnitude) and attention outputs high ones (the answer modulo 2, 5, 10). Cutting
    the low frequencies out of the MLPs, or the high ones out of attention, costs accuracy in different ways.

Number index
    t_0..t_{N-1}: the tokens of the numbers 0..N-1 as they follow the prompts (`data/number_tokens.py`;
    N = 10 on a digit-splitting tokenizer such as SmolLM2's, up to 1000 where the tokenizer has them). The
    frequencies are f = 0..F with F = floor(N / 2); frequency f has period N / f numbers. With N = 10 there are
    only six: f = 5 is the parity, f = 2 and 4 are mod-5 patterns, f = 1 is the magnitude.

Readout (per prompt i, at its END; shapes [layer, batch, ...])
    v[l, i]        a component's contribution to the residual: the attention output of layer l as it is added
                   (o_proj output, after Gemma 2/3's post-attention norm), or the MLP's (`logit_lens.mlp_update`).
    s_i            the final norm's scale of the intact final residual at END (`models/readout.FixedNorm`),
                   held fixed, as the MLP lens and LI do: the readout is then linear in v.
    R [N, d_model] the number tokens' readout rows: R[n] = c(g * W_U[t_n]), with g the final norm's effective
                   gain and c the mean-centering of a LayerNorm (the identity for RMSNorm), so that
                   R[n] . v / s = W_U[t_n] . (g * c(v) / s), the logit v adds to t_n through the fixed norm.
    L[l, i, n]   = R[n] . v[l, i] / s_i                                              [layer, batch, N]
    X[l, i, f]   = sum_n L[l, i, n] exp(-2 pi i f n / N),  f = 0..F (torch.fft.rfft, unnormalised)
    magnitude[l, f] = mean over prompts i of |X[l, i, f]|                             [layer, F + 1]

High-frequency share (one number per component group, with two references)
    The frequencies above half the highest, H = {f : 2 f > F} (N = 10: f = 3, 4, 5). Frequency f stands for
    m(f) real dimensions of the index, the rows of Phi at f: 1 for f = 0 and for f = N/2 (N even: the parity has
    no conjugate twin), 2 for every other f (a cosine and a sine, the conjugate pair f and N - f of the
    two-sided spectrum). The power of f is what those dimensions carry, and by Parseval the powers add up to
    the readout's energy:
        P[l, i, f] = m(f) |X[l, i, f]|^2,        sum_{f >= 1} P[l, i, f] = N * ||L[l, i] - mean_n L[l, i]||^2
        share      = sum_{l, i} sum_{f in H} P[l, i, f] / sum_{l, i} sum_{f >= 1} P[l, i, f]
    the share of the non-constant number-logit energy, over the chosen layers and the prompts, that lies on
    high frequencies. References, stated next to every share:
        flat       = (sum_{f in H} m(f)) / (N - 1)   the share of a flat (white) spectrum: every real dimension
                                                    equal (N = 10: 5 / 9 = 55.6%; N = 9: 4 / 8 = 50%)
        random     the share when each contribution v[l, i] is replaced by a random direction of the same norm
                   (Gaussian, seeded per prompt; `random_direction_power`), mean and standard deviation over the draws:
                   what the readout rows R alone make of a vector with no preference (they are not orthogonal,
                   so this is not the flat level).
    A share of one-sided magnitudes |X| (an earlier reading) gives f = N/2, one real dimension, the
    same single bin as every other f, which stands for two (the parity counts double), and on a white spectrum
    it scores 59.2% for N = 10, not 55.6%.

Filters (one component group at a time: every chosen layer's attention, or every chosen layer's MLP)
    The real orthonormal Fourier basis over the number index, Phi [N, N], has one row per (frequency, phase):
    1/sqrt(N) for f = 0; sqrt(2/N) cos(2 pi f n / N) and sqrt(2/N) sin(2 pi f n / N) for 0 < f < N/2; and
    (-1)^n / sqrt(N) for f = N/2 when N is even. For a set S of frequencies, the Fourier directions of the
    number-token unembedding are the rows of
        D_S = Phi_S R                                                               [|rows of S|, d_model]
    (the number tokens' readout rows projected onto the Fourier components f in S). The filter removes from
    each output o of the group (at every position, or at END only) its component in their span:
        o' = o - Q_S Q_S^T o,      Q_S [d_model, r] an orthonormal basis of the row space of D_S (SVD, float64)
    o' is the vector nearest to o (Euclidean, in the residual) whose number-logit readout has no component at
    any frequency in S (Phi_S R o' = 0), so each removed frequency is exactly zero in what the group writes, and
    the part of o outside the span of the number tokens' readout rows is kept. The kept frequencies' components
    may move too: the rows of R are not orthogonal in the residual, so a direction of D_S also reads on other
    frequencies (this is a projection in the residual space, not a filter applied to the logits). With cutoff
    tau:
        low-pass(tau)   removes S = {f : f > tau}  (keeps 0..tau)
        high-pass(tau)  removes S = {f : f < tau}  (keeps tau..F; f = 0, a shift of every number's logit, goes too)
    r = rank(D_S) <= min(|rows of S|, d_model); the model then runs as usual (every later layer, the real
    final norm) and is scored at END: accuracy (top token over the vocabulary == answer token) and the
    answer's probability.

Usage
    >>> readout = number_readout(view, number_ids)                   # [N, d_model]
    >>> logits = number_logits(view, end_contributions(view, states)["mlp"], states.resid_final, readout)
    >>> spectrum(logits).mean(1)                                      # [layer, F + 1]
    >>> high_share(spectral_power(logits).sum((0, 1)), 10), flat_high_share(10)     # share, 5 / 9
    >>> q = filter_directions(readout, removed_frequencies("low-pass", 2, n_numbers=10))
    >>> with fourier_filter(view, "mlp", q, layers=range(view.dims.n_layers)): ...

References: Zhou, Fu, Dong, Zhang, Jia, "Pre-trained Large Language Models Use Fourier Features to Compute
Addition", NeurIPS 2024 (arXiv 2406.03445), sections 3-4 (Fourier analysis of the logits, low/high-pass
filters); METHODS.md section 4 (the MLP lens' readout).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from arithmech.analysis.logit_lens import mlp_update
from arithmech.errors import ConfigError
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.readout import compute_dtype, final_norm
from arithmech.models.view import ModelView
from arithmech.patching.states import EndStates

_RANK_TOL = 1e-10
"""Singular values below this fraction of the largest do not count as directions of D_S."""


# -- the Fourier basis over the number index --
def fourier_basis(n_numbers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Phi [N, N] float64 with orthonormal rows, frequency of each row [N] long); see the module docstring."""
    n = torch.arange(n_numbers, dtype=torch.float64)
    rows, freqs = [torch.full((n_numbers,), 1 / math.sqrt(n_numbers), dtype=torch.float64)], [0]
    for f in range(1, (n_numbers + 1) // 2):
        angle = 2 * math.pi * f * n / n_numbers
        rows += [math.sqrt(2 / n_numbers) * torch.cos(angle), math.sqrt(2 / n_numbers) * torch.sin(angle)]
        freqs += [f, f]
    if n_numbers % 2 == 0:
        rows.append(torch.cos(math.pi * n) / math.sqrt(n_numbers))
        freqs.append(n_numbers // 2)
    return torch.stack(rows), torch.tensor(freqs)  # [N, N], [N]


def max_frequency(n_numbers: int) -> int:
    """F = floor(N / 2), the highest frequency over N numbers."""
    return n_numbers // 2


def removed_frequencies(kind: str, cutoff: int, n_numbers: int) -> list[int]:
    """The frequencies a filter removes: f > cutoff (low-pass) or f < cutoff (high-pass), within 0..F."""
    top = max_frequency(n_numbers)
    if kind not in ("low-pass", "high-pass"):
        raise ConfigError(f"filter {kind!r} is not low-pass or high-pass")
    if not 0 <= cutoff <= top:
        raise ConfigError(f"cutoff {cutoff} is not a frequency of {n_numbers} numbers; choose 0..{top}")
    return [f for f in range(top + 1) if (f > cutoff if kind == "low-pass" else f < cutoff)]


# -- readout of a component's contribution onto the number tokens --
@torch.no_grad()
def number_readout(view: ModelView, number_ids: torch.Tensor) -> torch.Tensor:
    """R [N, d_model] in the readout dtype: R[n] = c(g * W_U[t_n]), so R @ v / s = the number logits v adds."""
    norm = final_norm(view)
    rows = view.unembed.weight.detach()[number_ids.to(view.unembed.weight.device)]  # [N, d_model]
    return norm.center_of(rows.to(norm.gain.dtype) * norm.gain.to(rows.device))  # [N, d_model]


@torch.no_grad()
def end_contributions(view: ModelView, states: EndStates) -> dict[str, torch.Tensor]:
    """What each layer's attention and MLP add to the residual at END: {"attention", "mlp"} -> [layer, batch, d]."""
    attention = torch.stack([view.attn_resid(layer, states.attn_out[layer]) for layer in range(view.dims.n_layers)])
    return {"attention": attention, "mlp": mlp_update(view, states)}  # [layer, batch, d_model] each


@torch.no_grad()
def number_logits(
    view: ModelView, contributions: torch.Tensor, resid_final: torch.Tensor, readout: torch.Tensor
) -> torch.Tensor:
    """L = R v / s: contributions [layer, batch, d_model], resid_final [batch, d_model] -> [layer, batch, N]."""
    scale = final_norm(view).scale(resid_final.to(readout.device))  # [batch]
    dtype = compute_dtype(view)
    values = contributions.to(readout.device, dtype) @ readout.to(dtype).T  # [layer, batch, N]
    return values / scale[None, :, None]


def spectrum(logits: torch.Tensor) -> torch.Tensor:
    """|rfft| over the number index: [..., N] -> [..., F + 1] (f = 0..floor(N/2)), float64."""
    return torch.fft.rfft(logits.double(), dim=-1).abs()


def multiplicity(n_numbers: int) -> torch.Tensor:
    """m(f) [F + 1] long: the real dimensions of the index at each frequency (rows of `fourier_basis`)."""
    return torch.bincount(fourier_basis(n_numbers)[1], minlength=max_frequency(n_numbers) + 1)


def spectral_power(logits: torch.Tensor) -> torch.Tensor:
    """P = m(f) |rfft|^2 over the number index: [..., N] -> [..., F + 1] float64, summing (f >= 1) to N times the
    energy of the mean-centred logits (Parseval)."""
    return spectrum(logits) ** 2 * multiplicity(logits.shape[-1]).to(logits.device)


def high_frequencies(n_numbers: int) -> list[int]:
    """H = the frequencies above half the highest, f with 2 f > F."""
    top = max_frequency(n_numbers)
    return [f for f in range(1, top + 1) if 2 * f > top]


def high_share(power: torch.Tensor, n_numbers: int) -> torch.Tensor:
    """Share of the non-constant power on `high_frequencies`: power [..., F + 1] -> [...] (NaN where none)."""
    high = power[..., high_frequencies(n_numbers)].sum(-1)
    return high / power[..., 1:].sum(-1)


def flat_high_share(n_numbers: int) -> float:
    """The share of a flat (white) spectrum: the high frequencies' real dimensions over all N - 1 non-constant."""
    return float(multiplicity(n_numbers)[high_frequencies(n_numbers)].sum()) / (n_numbers - 1)


@torch.no_grad()
def random_direction_power(
    view: ModelView,
    contributions: torch.Tensor,
    resid_final: torch.Tensor,
    readout: torch.Tensor,
    draws: int,
    generators: Sequence[torch.Generator],
) -> torch.Tensor:
    """[draw, F + 1]: the power summed over layers and prompts when every contribution [layer, batch, d_model] is
    replaced by a Gaussian direction of its own norm, read like the real one. A prompt's directions come from its
    own generator (`generators`, one per prompt of the batch, on the CPU), so the draws do not depend on how the
    prompts are batched: the sum over two batches is the sum over one."""
    norms = contributions.double().norm(dim=-1, keepdim=True).cpu()  # [layer, batch, 1]
    layers, _, d_model = contributions.shape
    out = []
    for _ in range(draws):
        z = torch.stack([torch.randn(layers, d_model, generator=g, dtype=torch.float64) for g in generators], dim=1)
        fake = z / z.norm(dim=-1, keepdim=True) * norms  # [layer, batch, d_model]
        out.append(spectral_power(number_logits(view, fake.to(contributions.device), resid_final, readout)).sum((0, 1)))
    return torch.stack(out).cpu()  # [draw, F + 1]


def prompt_generators(seed: int, prompts: range) -> list[torch.Generator]:
    """One CPU generator per prompt index, seeded by the run's seed and the index."""
    return [torch.Generator().manual_seed((seed << 32) + i) for i in prompts]


# -- filters --
@torch.no_grad()
def filter_directions(readout: torch.Tensor, frequencies: Sequence[int]) -> torch.Tensor:
    """Q_S [d_model, r]: an orthonormal basis of the span of Phi_S R, S = `frequencies` (r = 0 for none)."""
    n_numbers, d_model = readout.shape
    basis, freq = fourier_basis(n_numbers)
    chosen = torch.isin(freq, torch.tensor(sorted(set(frequencies)), dtype=torch.long))
    if not bool(chosen.any()):
        return torch.zeros(d_model, 0, dtype=readout.dtype, device=readout.device)
    directions = basis[chosen].to(readout.device) @ readout.double()  # [rows of S, d_model]
    _, sing, v_t = torch.linalg.svd(directions, full_matrices=False)
    rank = int((sing > _RANK_TOL * sing.max().clamp_min(1e-300)).sum())
    return v_t[:rank].T.contiguous().to(readout.dtype)  # [d_model, r]


def _output_module(view: ModelView, group: str, layer: int) -> torch.nn.Module:
    """The module whose output is the group's contribution to the residual (a post-norm where there is one)."""
    if group == "attention":
        norm = view.attn_out_norm(layer)
        return norm if norm is not None else view.o_proj(layer)
    if group == "mlp":
        norm = view.mlp_out_norm(layer)
        return norm if norm is not None else view.mlp(layer)
    raise ConfigError(f"group {group!r} is not attention or mlp")


@contextmanager
def fourier_filter(
    view: ModelView,
    group: str,
    directions: torch.Tensor,
    layers: Sequence[int],
    end: torch.Tensor | None = None,
) -> Iterator[None]:
    """Inside the block, every `layers` output of `group` loses its part along `directions` [d_model, r]: at
    every position, or only at each row's END when `end` [batch] is given (rows as in the batch run)."""
    modules = [_output_module(view, group, layer) for layer in layers]

    def project(_module: Any, _args: Any, output: Any) -> Any:
        out = first_tensor(output)  # [batch, pos, d_model]
        q = directions.to(out.device)
        x = out.to(q.dtype)
        removed = (x @ q) @ q.T  # [batch, pos, d_model]
        if end is not None:
            at_end = torch.zeros(out.shape[:2], dtype=torch.bool, device=out.device)  # [batch, pos]
            at_end[torch.arange(out.shape[0], device=out.device), end.to(out.device)] = True
            removed = removed * at_end[..., None]
        new = (x - removed).to(out.dtype)
        return (new, *output[1:]) if isinstance(output, tuple) else new

    if directions.shape[1] == 0:
        yield
        return
    with hooks(post=[(module, project) for module in modules]):
        yield


@torch.no_grad()
def filtered_predictions(
    view: ModelView,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    end: torch.Tensor,
    answer_ids: torch.Tensor,
    group: str | None,
    directions: torch.Tensor | None,
    layers: Sequence[int],
    end_only: bool = False,
    batch_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct [batch] bool, answer probability [batch]) at END with the filter on (or none: group None)."""
    correct, probs = [], []
    for start in range(0, len(end), batch_size):
        rows = slice(start, start + batch_size)
        width = int(end[rows].max()) + 1
        if group is None or directions is None:
            logits = view.end_logits(input_ids[rows, :width], attention_mask[rows, :width], end[rows])
        else:
            with fourier_filter(view, group, directions, layers, end[rows] if end_only else None):
                logits = view.end_logits(input_ids[rows, :width], attention_mask[rows, :width], end[rows])
        answers = answer_ids[rows].to(logits.device)  # logits: [rows, d_vocab] float32
        correct.append((logits.argmax(-1) == answers).cpu())
        probs.append(logits.softmax(-1).gather(1, answers[:, None])[:, 0].cpu())
    return torch.cat(correct), torch.cat(probs)
