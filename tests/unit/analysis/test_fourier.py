"""Fourier features: the number-logit spectra and the low/high-pass filters equal a naive computation on every
tiny architecture (one unpadded prompt at a time, contributions read from the blocks' own inputs and outputs,
the readout through the model's own final norm module, a DFT written as sums of cosines and sines, the filter
as a pseudo-inverse projection hooked by hand, scored on full forward passes); and the filter's algebra."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from arithmech.analysis.fourier import (
    end_contributions,
    filter_directions,
    filtered_predictions,
    flat_high_share,
    fourier_basis,
    high_frequencies,
    high_share,
    multiplicity,
    number_logits,
    number_readout,
    prompt_generators,
    random_direction_power,
    removed_frequencies,
    spectral_power,
    spectrum,
)
from arithmech.errors import ConfigError
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks, first_tensor
from arithmech.models.readout import final_norm
from arithmech.models.view import ModelView
from arithmech.patching.states import collect_end_states

from tiny_models import TINY_ARCHS, make_tiny_model, make_tiny_tokenizer

PROMPTS = ["3+4=", "12+5=", "7+1=", "1+22+3="]
ANSWERS = ["7", "7", "8", "6"]
NUMBERS = torch.tensor([ord(str(n)) for n in range(10)])  # the byte tokenizer's digit tokens


def tiny_view(arch: str) -> ModelView:
    model = make_tiny_model(arch)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    tok = make_tiny_tokenizer()
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    end = batch["attention_mask"].sum(1) - 1
    answers = torch.tensor([ord(a) for a in ANSWERS])
    return batch["input_ids"], batch["attention_mask"], end, answers


# -- naive pieces --
def naive_fixed_readout(view: ModelView, x_final: torch.Tensor) -> Any:
    """v -> W_U[numbers] . (g * c(v)) / s(x_final) through the final norm module itself:
    g * c(v) = (norm(c(v)) - norm(0)) * sqrt(mean(c(v)^2) + eps), s = sqrt(mean(c(x)^2) + eps)."""
    norm = view.final_norm
    eps = getattr(norm, "eps", None) or norm.variance_epsilon
    layer_norm = isinstance(norm, torch.nn.LayerNorm)
    d = x_final.shape[-1]

    def center(y: torch.Tensor) -> torch.Tensor:
        return y - y.mean() if layer_norm else y

    scale = math.sqrt(float(center(x_final).pow(2).mean()) + eps)
    bias = norm(torch.zeros(1, d))[0]
    w_u = view.unembed.weight[NUMBERS]  # [N, d_model]

    @torch.no_grad()
    def read(v: torch.Tensor) -> torch.Tensor:
        c = center(v)
        gained = (norm(c[None])[0] - bias) * math.sqrt(float(c.pow(2).mean()) + eps)
        return (w_u @ gained).double() / scale  # [N]

    return read


def naive_dft(values: torch.Tensor) -> torch.Tensor:
    """|sum_n L[n] exp(-2 pi i f n / N)| for f = 0..N/2, written out."""
    n_numbers = len(values)
    out = []
    for f in range(n_numbers // 2 + 1):
        re = sum(float(values[n]) * math.cos(2 * math.pi * f * n / n_numbers) for n in range(n_numbers))
        im = sum(float(values[n]) * math.sin(2 * math.pi * f * n / n_numbers) for n in range(n_numbers))
        out.append(math.hypot(re, im))
    return torch.tensor(out, dtype=torch.float64)


@torch.no_grad()
def naive_contributions(view: ModelView, ids: torch.Tensor) -> tuple[dict[str, list[torch.Tensor]], torch.Tensor]:
    """One unpadded prompt: each layer's attention and MLP contribution at the last token, from the blocks' own
    inputs and outputs (the attention's o_proj output for parallel blocks), and the final residual there."""
    n, seen = view.dims.n_layers, {}
    handles = []

    def keep(key: Any, pre: bool) -> Any:
        if pre:
            return lambda _m, args: seen.__setitem__(key, args[0][0, -1].clone())
        return lambda _m, _a, out: seen.__setitem__(key, first_tensor(out)[0, -1].clone())

    for layer in range(n):
        handles.append(view.blocks[layer].register_forward_pre_hook(keep(("in", layer), True)))
        handles.append(view.blocks[layer].register_forward_hook(keep(("out", layer), False)))
        handles.append(view.mlp_norm(layer).register_forward_pre_hook(keep(("mlp_in", layer), True)))
        handles.append(view.o_proj(layer).register_forward_hook(keep(("o", layer), False)))
    handles.append(view.final_norm.register_forward_pre_hook(keep("final", True)))
    try:
        view.model(input_ids=ids[None], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    out: dict[str, list[torch.Tensor]] = {"attention": [], "mlp": []}
    for layer in range(n):
        block_in, block_out = seen[("in", layer)], seen[("out", layer)]
        if view.parallel_residual:
            attention = seen[("o", layer)]
            mlp = block_out - block_in - attention
        else:
            attention = seen[("mlp_in", layer)] - block_in
            mlp = block_out - seen[("mlp_in", layer)]
        out["attention"].append(attention)
        out["mlp"].append(mlp)
    return out, seen["final"]


def naive_basis_rows(n_numbers: int, frequencies: list[int]) -> torch.Tensor:
    rows = []
    n = torch.arange(n_numbers, dtype=torch.float64)
    for f in frequencies:
        if f == 0 or 2 * f == n_numbers:
            rows.append(torch.cos(2 * math.pi * f * n / n_numbers) / math.sqrt(n_numbers))
        else:
            rows.append(math.sqrt(2 / n_numbers) * torch.cos(2 * math.pi * f * n / n_numbers))
            rows.append(math.sqrt(2 / n_numbers) * torch.sin(2 * math.pi * f * n / n_numbers))
    return torch.stack(rows)


@torch.no_grad()
def naive_filtered(
    view: ModelView, group: str, frequencies: list[int], end_only: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prompt, unpadded: the group's outputs minus their projection on the row space of Phi_S R (pinv),
    hooked by hand on the modules the arch spec names; the answer's probability and top-1 from model().logits."""
    ids, mask, _, answers = padded_batch()
    d = view.dims.d_model
    correct, probs = [], []
    spec = view.spec
    path = (spec.attn_out_norm or spec.o_proj) if group == "attention" else (spec.mlp_out_norm or spec.mlp)
    modules = [view.blocks[layer].get_submodule(path) for layer in range(view.dims.n_layers)]
    for i in range(len(PROMPTS)):
        row = ids[i, : int(mask[i].sum())]
        _, x_final = naive_contributions(view, row)
        read = naive_fixed_readout(view, x_final)
        scale_free = torch.stack([read(torch.eye(d)[j]) for j in range(d)], dim=1)  # [N, d] = R / s
        directions = naive_basis_rows(10, frequencies) @ scale_free  # [rows, d]; R / s spans what R spans
        projection = torch.linalg.pinv(directions) @ directions  # [d, d]

        def hook(_m: Any, _a: Any, out: Any, projection: torch.Tensor = projection) -> Any:
            x = first_tensor(out)
            new = x - (x.double() @ projection).to(x.dtype) * (1 if not end_only else _last(x))
            return (new, *out[1:]) if isinstance(out, tuple) else new

        handles = [module.register_forward_hook(hook) for module in modules]
        try:
            logits = view.model(input_ids=row[None], use_cache=False).logits[0, -1].double()
        finally:
            for handle in handles:
                handle.remove()
        probs.append(logits.softmax(-1)[answers[i]])
        correct.append(bool(logits.argmax() == answers[i]))
    return torch.tensor(correct), torch.stack(probs)


def _last(x: torch.Tensor) -> torch.Tensor:
    """[1, pos, 1] mask of the last position."""
    mask = torch.zeros(x.shape[0], x.shape[1], 1, dtype=x.dtype)
    mask[:, -1] = 1
    return mask


# -- tests --
@pytest.mark.parametrize("arch", list(TINY_ARCHS))
def test_spectrum_equals_naive_dft_of_block_contributions(arch: str) -> None:
    view = tiny_view(arch)
    ids, mask, end, _ = padded_batch()
    states = collect_end_states(view, ids, mask, end)
    readout = number_readout(view, NUMBERS)
    contributions = end_contributions(view, states)
    for kind in ("attention", "mlp"):
        got = spectrum(number_logits(view, contributions[kind], states.resid_final, readout))  # [layer, batch, 6]
        for i in range(len(PROMPTS)):
            naive, x_final = naive_contributions(view, ids[i, : int(mask[i].sum())])
            read = naive_fixed_readout(view, x_final)
            for layer in range(view.dims.n_layers):
                expected = naive_dft(read(naive[kind][layer]))
                torch.testing.assert_close(got[layer, i], expected, rtol=1e-4, atol=1e-4 * float(expected.max()))


@pytest.mark.parametrize("arch", list(TINY_ARCHS))
@pytest.mark.parametrize(("group", "kind", "cutoff", "end_only"), [
    ("mlp", "high-pass", 2, False), ("attention", "low-pass", 1, True),
])  # fmt: skip
def test_filter_equals_naive_projection_on_full_forwards(
    arch: str, group: str, kind: str, cutoff: int, end_only: bool
) -> None:
    view = tiny_view(arch)
    ids, mask, end, answers = padded_batch()
    frequencies = removed_frequencies(kind, cutoff, 10)
    directions = filter_directions(number_readout(view, NUMBERS), frequencies)
    layers = range(view.dims.n_layers)
    correct, prob = filtered_predictions(view, ids, mask, end, answers, group, directions, layers, end_only,
                                         batch_size=3)  # fmt: skip
    assert count_hooks(view.model) == 0
    naive_correct, naive_prob = naive_filtered(view, group, frequencies, end_only)
    torch.testing.assert_close(prob.double(), naive_prob, rtol=1e-4, atol=1e-6)
    assert torch.equal(correct, naive_correct)
    _, intact = filtered_predictions(view, ids, mask, end, answers, None, None, layers)
    assert (prob - intact).abs().max() > 1e-5  # the filter changes something the test can see


def test_filter_zeroes_exactly_the_removed_frequencies() -> None:
    view = tiny_view("llama")
    readout = number_readout(view, NUMBERS).double()  # [10, d_model]
    x = torch.randn(5, view.dims.d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for kind, cutoff in (("low-pass", 2), ("high-pass", 3), ("high-pass", 0), ("low-pass", 5)):
        removed = removed_frequencies(kind, cutoff, 10)
        q = filter_directions(readout, removed)
        kept = x - (x @ q) @ q.T
        before, after = spectrum(x @ readout.T), spectrum(kept @ readout.T)  # [5, 6]
        for f in removed:
            assert float(after[:, f].abs().max()) < 1e-9 * float(before.abs().max())
        kept_f = [f for f in range(6) if f not in removed]
        if kept_f and removed:
            assert float((after[:, kept_f] - before[:, kept_f]).abs().max()) > 1e-6  # a projection, not a logit filter
        assert float((kept @ q).abs().sum()) < 1e-9 * float(x.abs().max())  # nothing left along D_S
        inside = x @ q @ q.T  # a vector already in the span loses all of itself; one outside it loses nothing
        assert float((inside - inside @ q @ q.T).abs().max()) < 1e-9
        torch.testing.assert_close(kept - (kept @ q) @ q.T, kept)
        assert q.shape[1] == sum(1 if f in (0, 5) else 2 for f in removed)  # rows of Phi_S (rank <= d_model)


def test_basis_is_orthonormal_with_one_frequency_per_row() -> None:
    for n in (10, 7, 100):
        basis, freq = fourier_basis(n)
        torch.testing.assert_close(basis @ basis.T, torch.eye(n, dtype=torch.float64))
        power = spectrum(basis)  # [N, F + 1]
        assert torch.equal(power.argmax(-1), freq)
    assert removed_frequencies("low-pass", 2, 10) == [3, 4, 5]
    assert removed_frequencies("high-pass", 2, 10) == [0, 1]
    with pytest.raises(ConfigError, match="not a frequency of 10 numbers; choose 0..5"):
        removed_frequencies("low-pass", 6, 10)


# -- the high-frequency share --
@pytest.mark.parametrize(("n", "high", "flat"), [(10, [3, 4, 5], 5 / 9), (9, [3, 4], 4 / 8), (7, [2, 3], 4 / 6),
                                                 (4, [2], 1 / 3), (100, list(range(26, 51)), 49 / 99)])  # fmt: skip
def test_a_flat_spectrum_scores_the_share_of_high_dimensions(n: int, high: list[int], flat: float) -> None:
    """An impulse has |X_f| = 1 at every f (a flat spectrum): its share is exactly the high frequencies' share of
    the N - 1 non-constant real dimensions, for odd and even N. One-sided magnitudes (the reading before issue
    21) gave 3 of 5 bins = 60% for N = 10, and 59.2% on white noise."""
    assert high_frequencies(n) == high and flat_high_share(n) == pytest.approx(flat, abs=1e-15)
    impulse = torch.zeros(n, dtype=torch.float64)
    impulse[0] = 1.0
    assert torch.allclose(spectrum(impulse), torch.ones(n // 2 + 1, dtype=torch.float64))
    assert float(high_share(spectral_power(impulse), n)) == pytest.approx(flat, abs=1e-12)
    assert int(multiplicity(n).sum()) == n  # one real dimension per row of the basis


@pytest.mark.parametrize("n", [10, 9])
def test_white_noise_scores_the_flat_level_and_power_is_parseval(n: int) -> None:
    x = torch.randn(200_000, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # white
    power = spectral_power(x)  # [sample, F + 1]
    centred = x - x.mean(-1, keepdim=True)
    torch.testing.assert_close(power[:, 1:].sum(-1), n * (centred**2).sum(-1))  # Parseval over the real dimensions
    assert float(high_share(power.sum(0), n)) == pytest.approx(flat_high_share(n), abs=0.003)
    one_sided = spectrum(x).sum(0)  # the old reading: magnitudes, one bin per frequency
    old = float(one_sided[high_frequencies(n)].sum() / one_sided[1:].sum())
    if n == 10:
        assert old == pytest.approx(0.592, abs=0.003)  # what the old share called "flat"


def test_random_directions_keep_each_norm_and_read_through_the_readout() -> None:
    """The mean power of many draws matches its closed form for directions uniform on each contribution's sphere:
    E P[f] = N sum_{l, i} ||v[l, i]||^2 / (d_model s_i^2) ||Phi_f R||_F^2 (E[z z^T] = ||v||^2 / d_model I)."""
    view = tiny_view("llama")
    ids, mask, end, _ = padded_batch()
    states = collect_end_states(view, ids, mask, end)
    readout = number_readout(view, NUMBERS).double()
    contributions = end_contributions(view, states)["mlp"].double()  # [layer, batch, d_model]
    batch = range(contributions.shape[1])
    a = random_direction_power(view, contributions, states.resid_final, readout, 4, prompt_generators(1, batch))
    b = random_direction_power(view, contributions, states.resid_final, readout, 4, prompt_generators(1, batch))
    assert a.shape == (4, 6) and torch.equal(a, b)  # seeded
    split = [random_direction_power(view, contributions[:, rows], states.resid_final[rows], readout, 4,
                                    prompt_generators(1, batch[rows])) for rows in (slice(0, 1), slice(1, None))]
    torch.testing.assert_close(split[0] + split[1], a)  # a prompt's draws do not depend on its batch
    many = random_direction_power(view, contributions, states.resid_final, readout, 300,
                                  prompt_generators(2, batch))  # fmt: skip
    basis, freq = fourier_basis(10)
    rows = (basis @ readout).pow(2).sum(-1)  # [N]: ||Phi_r R||^2
    per_f = torch.zeros(6, dtype=torch.float64).index_add_(0, freq, rows)  # [F + 1]
    scale = final_norm(view).scale(states.resid_final).double()  # [batch]
    weight = (contributions.norm(dim=-1) ** 2 / scale**2).sum() / contributions.shape[-1]
    torch.testing.assert_close(many.mean(0), 10 * weight * per_f, rtol=0.1, atol=0.0)
    shares = high_share(a, 10)
    assert bool(((shares > 0) & (shares < 1)).all()) and float(shares.std()) > 0
