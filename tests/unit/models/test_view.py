"""ModelView against the real forward pass of every tiny architecture: per-head outputs, Q/K/V/O weight
slices, dims, the residual contributions of attention and MLP, and the logit readout."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
import torch

from arithmech.errors import SpecError
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks, first_tensor, hooks
from arithmech.models.view import ModelView, WeightSlice

from tiny_models import TINY_ARCHS, TINY_VOCAB_SIZE, make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = sorted(TINY_ARCHS)
ATOL = 1e-5

# arch -> (n_layers, n_heads, n_kv_heads, d_model, d_head), written out rather than read from the config
EXPECTED_DIMS: dict[str, tuple[int, int, int, int, int]] = {
    "gemma": (2, 4, 1, 64, 16),
    "gemma2": (2, 4, 2, 64, 16),
    "gemma3": (3, 4, 2, 48, 16),
    "gpt-neox": (2, 4, 4, 64, 16),
    "gpt-neox-seq": (2, 4, 4, 64, 16),
    "gpt2": (2, 4, 4, 32, 8),
    "llama": (3, 4, 2, 64, 16),
    "llama-mqa": (2, 4, 1, 64, 16),
    "llama-wide-heads": (2, 4, 2, 48, 16),
    "mistral": (2, 4, 2, 64, 16),
    "phi3": (2, 4, 2, 64, 16),
    "qwen2": (2, 4, 2, 64, 16),
}


@cache
def view_of(arch: str) -> ModelView:
    """One tiny model per arch for the whole module (tests that edit weights restore them)."""
    model = make_tiny_model(arch, seed=0)
    return ModelView(model, spec_for_model_type(model.config.model_type))


def random_ids(batch: int = 2, seq: int = 7, seed: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, seq), generator=gen)


@dataclass
class Capture:
    """Tensors seen during one forward pass, per layer."""

    attn_norm_in: dict[int, torch.Tensor] = field(default_factory=dict)  # block input
    attn_norm_out: dict[int, torch.Tensor] = field(default_factory=dict)  # x read by Q/K/V
    z: dict[int, torch.Tensor] = field(default_factory=dict)  # o_proj input
    attn_out: dict[int, torch.Tensor] = field(default_factory=dict)  # o_proj output
    mlp_read: dict[int, torch.Tensor] = field(default_factory=dict)  # mlp_norm input
    block_out: dict[int, torch.Tensor] = field(default_factory=dict)
    proj_out: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)  # q/k/v/qkv outputs
    final_in: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    pattern: dict[int, torch.Tensor] = field(default_factory=dict)  # eager attention weights [b, head, q, k]


def _pre(store: dict[Any, torch.Tensor], key: Any):
    def fn(module, args):
        store[key] = args[0].detach().clone()

    return fn


def _post(store: dict[Any, torch.Tensor], key: Any):
    def fn(module, args, output):
        store[key] = first_tensor(output).detach().clone()

    return fn


def _pattern(store: dict[int, torch.Tensor], key: int):
    def fn(module, args, output):
        assert isinstance(output, tuple) and output[1] is not None, "attention weights not returned (eager?)"
        store[key] = output[1].detach().clone()

    return fn


def run_captured(view: ModelView, ids: torch.Tensor) -> Capture:
    cap = Capture()
    pre, post = [], []
    final: dict[str, torch.Tensor] = {}
    s = view.spec
    for layer in range(view.dims.n_layers):
        pre.append((view.attn_norm(layer), _pre(cap.attn_norm_in, layer)))
        post.append((view.attn_norm(layer), _post(cap.attn_norm_out, layer)))
        pre.append((view.o_proj(layer), _pre(cap.z, layer)))
        post.append((view.o_proj(layer), _post(cap.attn_out, layer)))
        pre.append((view.mlp_norm(layer), _pre(cap.mlp_read, layer)))
        post.append((view.blocks[layer], _post(cap.block_out, layer)))
        for name in ("q_proj", "k_proj", "v_proj", "qkv_proj"):
            path = getattr(s, name)
            if path:
                post.append((view.module(layer, path), _post(cap.proj_out, (layer, name))))
        # the eager attention module returns (output, weights); read the weights without output_attentions,
        # which would make transformers install hooks of its own that outlive the call
        attention = view.module(layer, s.o_proj.rsplit(".", 1)[0])
        post.append((attention, _pattern(cap.pattern, layer)))
    pre.append((view.final_norm, _pre(final, "in")))
    with torch.no_grad(), hooks(pre=pre, post=post):
        out = view.model(input_ids=ids)
    assert count_hooks(view.model) == 0
    cap.final_in = final["in"]
    cap.logits = out.logits.detach()
    assert len(cap.z) == view.dims.n_layers and len(cap.mlp_read) == view.dims.n_layers
    return cap


@cache
def captured(arch: str) -> Capture:
    return run_captured(view_of(arch), random_ids())


def apply_slice(view: ModelView, ws: WeightSlice, x: torch.Tensor) -> torch.Tensor:
    """x [..., in] through the sliced projection, by hand: Linear is x W^T + b, Conv1D is x W + b."""
    w = ws.weight()
    y = x @ w if view.spec.conv1d else x @ w.T
    b = ws.bias()
    return y + b if b is not None else y


def projection_columns(view: ModelView, cap: Capture, layer: int, head: int) -> dict[str, torch.Tensor]:
    """Head `head`'s q and its kv group's k, v read from the real projection outputs, laid out per family
    (written here independently of view.head_weight_slices)."""
    d, s = view.dims, view.spec
    dh, kv = d.d_head, head // (d.n_heads // d.n_kv_heads)
    q_cols = slice(head * dh, (head + 1) * dh)
    kv_cols = slice(kv * dh, (kv + 1) * dh)
    if s.qkv_layout == "separate":
        return {
            "q": cap.proj_out[(layer, "q_proj")][..., q_cols],
            "k": cap.proj_out[(layer, "k_proj")][..., kv_cols],
            "v": cap.proj_out[(layer, "v_proj")][..., kv_cols],
        }
    fused = cap.proj_out[(layer, "qkv_proj")]
    if s.qkv_layout == "concat":  # [Q (H*dh) | K (Hkv*dh) | V (Hkv*dh)]
        q_all, k_all, v_all = fused.split([d.n_heads * dh, d.n_kv_heads * dh, d.n_kv_heads * dh], dim=-1)
        return {"q": q_all[..., q_cols], "k": k_all[..., kv_cols], "v": v_all[..., kv_cols]}
    assert s.qkv_layout == "interleaved"  # [..., head, (q | k | v)] as GPTNeoXAttention views it
    per_head = fused.reshape(*fused.shape[:-1], d.n_heads, 3 * dh)[..., head, :]
    q, k, v = per_head.chunk(3, dim=-1)
    return {"q": q, "k": k, "v": v}


@contextmanager
def perturbed(ws: WeightSlice, seed: int = 5) -> Iterator[None]:
    """Add noise to exactly the weight entries a slice selects; restore them after."""
    weight = ws.module.weight
    saved = weight.detach().clone()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        block = weight[ws.index] if ws.dim == 0 else weight[:, ws.index]
        noise = torch.randn(block.shape, generator=gen) * 2.0
        if ws.dim == 0:
            weight[ws.index] += noise
        else:
            weight[:, ws.index] += noise
    try:
        yield
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def layer_heads() -> list[tuple[str, int, int]]:
    """A couple of (layer, head) per arch: first layer/first head, last layer/last head, a middle one."""
    out = []
    for arch in ARCHS:
        n_layers, n_heads = EXPECTED_DIMS[arch][:2]
        for layer, head in {(0, 0), (n_layers - 1, n_heads - 1), (n_layers // 2, 1)}:
            out.append((arch, layer, head))
    return sorted(out)


# -- identity: sum over heads + b_O = o_proj output ---------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_head_outputs_sum_to_o_proj_output(arch: str) -> None:
    view, cap = view_of(arch), captured(arch)
    for layer in range(view.dims.n_layers):
        per_head = view.head_outputs(layer, cap.z[layer])
        assert per_head.shape == (*cap.z[layer].shape[:-1], view.dims.n_heads, view.dims.d_model)
        b_o = view.b_O(layer)
        total = per_head.sum(-2) + (b_o if b_o is not None else 0)
        torch.testing.assert_close(total, cap.attn_out[layer], atol=ATOL, rtol=1e-5)
        # every head contributes something: a wrong split (e.g. head-major vs d_head-major) cannot hide
        assert (per_head.abs().amax(dim=(0, 1, 3)) > 1e-3).all()


@pytest.mark.parametrize("arch", ["gpt2", "gpt-neox", "qwen2", "phi3"])
def test_b_O_matches_o_proj_bias(arch: str) -> None:
    view = view_of(arch)
    bias = getattr(view.o_proj(0), "bias", None)
    if bias is None:
        assert view.b_O(0) is None
    else:
        assert view.b_O(0) is bias


# -- Q/K/V/O slices -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("arch", "layer", "head"), layer_heads())
def test_qkv_slices_match_projection_outputs(arch: str, layer: int, head: int) -> None:
    view, cap = view_of(arch), captured(arch)
    slices = view.head_weight_slices(layer, head)
    assert set(slices) == {"q", "k", "v", "o"}
    x = cap.attn_norm_out[layer]
    expected = projection_columns(view, cap, layer, head)
    for name in "qkv":
        got = apply_slice(view, slices[name], x)
        assert got.shape[-1] == view.dims.d_head
        torch.testing.assert_close(got, expected[name], atol=ATOL, rtol=1e-5, msg=f"{arch} {name}")
        assert expected[name].abs().max() > 1e-2


@pytest.mark.parametrize(("arch", "layer", "head"), layer_heads())
def test_o_slice_gives_head_output(arch: str, layer: int, head: int) -> None:
    view, cap = view_of(arch), captured(arch)
    o = view.head_weight_slices(layer, head)["o"]
    assert o.bias() is None  # o_proj's bias belongs to no single head
    dh = view.dims.d_head
    z_h = cap.z[layer][..., head * dh : (head + 1) * dh]
    got = z_h @ o.weight() if view.spec.conv1d else z_h @ o.weight().T
    torch.testing.assert_close(got, view.head_outputs(layer, cap.z[layer])[..., head, :], atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_group_mapping(arch: str) -> None:
    """Query head h reads kv head h // (H / H_kv): its K/V slices are that kv head's columns."""
    view = view_of(arch)
    n_layers, n_heads, n_kv, _, dh = EXPECTED_DIMS[arch]
    for head in range(n_heads):
        kv = head // (n_heads // n_kv)
        if arch in ("llama-mqa", "gemma"):
            assert kv == 0
        k_slice = view.head_weight_slices(n_layers - 1, head)["k"]
        start = {
            "separate": kv * dh,
            "concat": n_heads * dh + kv * dh,  # after all query heads
            "interleaved": head * 3 * dh + dh,  # [q_h | k_h | v_h]
        }[view.spec.qkv_layout]
        assert (k_slice.index.start, k_slice.index.stop) == (start, start + dh)
    if arch == "llama-mqa":  # all heads share kv 0: identical K and V slices
        first = view.head_weight_slices(0, 0)
        for head in range(1, n_heads):
            other = view.head_weight_slices(0, head)
            for name in "kv":
                assert other[name].index == first[name].index
                assert torch.equal(other[name].weight(), first[name].weight())


def _changed(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() > 1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_slices_are_what_the_head_reads(arch: str) -> None:
    """Perturbing head h's Q slice changes only head h's attention pattern; its K slice changes exactly the
    patterns of h's kv group; its V slice changes exactly the group's columns of z and no pattern."""
    view = view_of(arch)
    d = view.dims
    layer, head = d.n_layers - 1, 1  # head 1: in kv group 0 when groups have 2 heads (catches h % H_kv)
    ids = random_ids(batch=1, seq=6, seed=9)
    base = run_captured(view, ids)
    group = {h for h in range(d.n_heads) if h // d.group_size == head // d.group_size}
    slices = view.head_weight_slices(layer, head)
    for name, readers in (("q", {head}), ("k", group)):
        with perturbed(slices[name]):
            cap = run_captured(view, ids)
        pattern_changed = {h for h in range(d.n_heads) if _changed(cap.pattern[layer][:, h], base.pattern[layer][:, h])}
        assert pattern_changed == readers, f"{name}: changed {pattern_changed}, expected {readers}"
    with perturbed(slices["v"]):
        cap = run_captured(view, ids)
    assert not _changed(cap.pattern[layer], base.pattern[layer])
    z, z0 = view.split_heads(cap.z[layer]), view.split_heads(base.z[layer])
    z_changed = {h for h in range(d.n_heads) if _changed(z[..., h, :], z0[..., h, :])}
    assert z_changed == group
    after = run_captured(view, ids)  # weights restored
    torch.testing.assert_close(after.logits, base.logits, atol=0, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_head_weight_slices_out_of_range(arch: str) -> None:
    view = view_of(arch)
    for bad in (-1, view.dims.n_heads, view.dims.n_heads + 3):
        with pytest.raises(SpecError, match=rf"heads 0\.\.{view.dims.n_heads - 1}"):
            view.head_weight_slices(0, bad)


# -- dims and config flags -------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_dims(arch: str) -> None:
    view = view_of(arch)
    n_layers, n_heads, n_kv, d_model, d_head = EXPECTED_DIMS[arch]
    d = view.dims
    got = (d.n_layers, d.n_heads, d.n_kv_heads, d.d_model, d.d_head)
    assert got == (n_layers, n_heads, n_kv, d_model, d_head)
    assert d.d_vocab == TINY_VOCAB_SIZE
    assert d.group_size == n_heads // n_kv
    assert view.W_O(0).shape == (n_heads, d_head, d_model)
    if arch in ("gemma3", "llama-wide-heads"):
        assert d.n_heads * d.d_head != d.d_model
        assert (d.n_heads * d.d_head, d.d_model) == (64, 48)
    else:
        assert d.n_heads * d.d_head == d.d_model


@pytest.mark.parametrize("arch", ARCHS)
def test_parallel_residual_and_softcap(arch: str) -> None:
    view = view_of(arch)
    assert view.parallel_residual is (arch == "gpt-neox")
    if arch == "gemma2":
        assert view.logit_softcap == 5.0
    else:
        assert view.logit_softcap is None


def test_view_rejects_a_spec_that_does_not_fit() -> None:
    model = make_tiny_model("llama", seed=0)
    with pytest.raises(SpecError, match="gpt2"):
        ModelView(model, spec_for_model_type("gpt2"))


# -- readout and residual contributions ----------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_answer_logits_match_model_logits(arch: str) -> None:
    view, cap = view_of(arch), captured(arch)
    assert cap.final_in is not None and cap.logits is not None
    batch, seq = cap.final_in.shape[:2]
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, TINY_VOCAB_SIZE, (batch,), generator=gen)
    resid = cap.final_in.transpose(0, 1)  # [seq, batch, d_model]: extra leading dims
    got = view.answer_logits(resid, ids)
    assert got.shape == (seq, batch) and got.dtype == torch.float32
    expected = cap.logits[torch.arange(batch), :, ids].T  # [seq, batch]
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-5)
    # the model's own top tokens at the last position
    top = cap.logits[:, -1].argmax(-1)
    torch.testing.assert_close(
        view.answer_logits(cap.final_in[:, -1], top), cap.logits[:, -1].amax(-1), atol=ATOL, rtol=1e-5
    )
    if arch == "gemma2":  # the cap is active at these magnitudes: without it the readout would differ
        assert view.logit_softcap is not None
        assert cap.logits.abs().max() < view.logit_softcap
        raw = (view.final_norm(cap.final_in) @ view.unembed.weight.T)[torch.arange(batch), :, ids].T
        assert (raw - expected).abs().max() > 1e-2


@pytest.mark.parametrize("arch", ARCHS)
def test_attn_and_mlp_resid_add_up_to_block_output(arch: str) -> None:
    """block output = block input + attn_resid(o_proj output) + mlp_resid(mlp_read), every layer."""
    view, cap = view_of(arch), captured(arch)
    for layer in range(view.dims.n_layers):
        with torch.no_grad():
            attn = view.attn_resid(layer, cap.attn_out[layer])
            mlp = view.mlp_resid(layer, cap.mlp_read[layer])
        expected_mlp = cap.block_out[layer] - cap.attn_norm_in[layer] - attn
        torch.testing.assert_close(mlp, expected_mlp, atol=ATOL, rtol=1e-5)
        if view.parallel_residual:  # MLP reads the block input
            torch.testing.assert_close(cap.mlp_read[layer], cap.attn_norm_in[layer], atol=0, rtol=0)
        else:  # MLP reads the residual after attention
            torch.testing.assert_close(cap.mlp_read[layer], cap.attn_norm_in[layer] + attn, atol=ATOL, rtol=1e-5)
        assert mlp.abs().max() > 1e-2 and attn.abs().max() > 1e-2


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_sandwich_norms_are_part_of_the_contributions(arch: str) -> None:
    """Without the post-feedforward / post-attention norms the contributions would be different."""
    view, cap = view_of(arch), captured(arch)
    assert view.mlp_out_norm(0) is not None and view.attn_out_norm(0) is not None
    with torch.no_grad():
        bare_mlp = view.mlp(0)(view.mlp_norm(0)(cap.mlp_read[0]))
        normed_mlp = view.mlp_resid(0, cap.mlp_read[0])
    assert (bare_mlp - normed_mlp).abs().max() > 1e-2
    assert (view.attn_resid(0, cap.attn_out[0]) - cap.attn_out[0]).abs().max() > 1e-2


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt-neox"])
def test_no_output_norms_outside_gemma2_3(arch: str) -> None:
    view, cap = view_of(arch), captured(arch)
    assert view.mlp_out_norm(0) is None and view.attn_out_norm(0) is None
    assert view.attn_resid(0, cap.attn_out[0]) is cap.attn_out[0]


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_end_logits_equal_model_logits_at_end(arch: str) -> None:
    model = make_tiny_model(arch, seed=0)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    ids = torch.randint(3, 250, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    end = torch.tensor([6, 4, 6])
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits[torch.arange(3), end]
        fast = view.end_logits(ids, mask, end)
    torch.testing.assert_close(fast, full.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_down_projection_reads_the_neurons(arch: str) -> None:
    """Every spec names its MLP's down projection, whose input width is the number of neurons."""
    view = view_of(arch)
    module = view.down_proj(0)
    d_mlp = module.weight.shape[0] if view.spec.conv1d else module.weight.shape[1]
    config = view.model.config
    assert d_mlp == (getattr(config, "intermediate_size", None) or config.n_inner)
