"""The tiny random models used across the unit tests: they build, pad exactly, reload, are seeded."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tiny_models import EOS_ID, PAD_ID, TINY_ARCHS, TINY_VOCAB_SIZE, make_tiny_model, make_tiny_tokenizer

ARCHS = sorted(TINY_ARCHS)
# Different lengths; the longest (> sliding window of 8) exercises Gemma2/3 sliding layers.
TEXTS = ["123+456=579", "7+8=15", "Q: 9 + 99 = ? A: 108. Q: 31+4 ="]
EXPECTED_CLASS = {
    "llama": "LlamaForCausalLM",
    "llama-mqa": "LlamaForCausalLM",
    "llama-wide-heads": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt-neox": "GPTNeoXForCausalLM",
    "gpt-neox-seq": "GPTNeoXForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {arch: make_tiny_model(arch) for arch in ARCHS}


def _last_real_logits(model, tokenizer, texts, device):  # -> [batch, vocab] (padded), [batch, vocab] (alone)
    batch = tokenizer(texts, return_tensors="pt", padding=True).to(device)
    assert batch.attention_mask[:, 0].all() and not batch.attention_mask.all()  # right-padded, ragged
    last = batch.attention_mask.sum(dim=1) - 1  # [batch]
    with torch.no_grad():
        full = model(**batch).logits  # [batch, seq, vocab]
        assert torch.isfinite(full).all()  # pad positions too
        padded = full[torch.arange(len(texts)), last]  # [batch, vocab]
        alone = torch.stack(
            [model(**tokenizer(t, return_tensors="pt").to(device)).logits[0, -1] for t in texts]
        )  # [batch, vocab]
    return padded, alone


def test_tokenizer_is_byte_level_with_single_digit_tokens(tiny_tokenizer) -> None:
    assert len(tiny_tokenizer) == TINY_VOCAB_SIZE
    assert (tiny_tokenizer.pad_token_id, tiny_tokenizer.eos_token_id) == (PAD_ID, EOS_ID)
    assert tiny_tokenizer.padding_side == "right"
    assert tiny_tokenizer("0123456789").input_ids == list(range(48, 58))  # id == byte value
    text = "12 + 345 = 357\né"
    ids = tiny_tokenizer(text).input_ids
    assert len(ids) == len(text.encode())  # one token per byte, no BOS
    assert tiny_tokenizer.decode(ids) == text


def test_all_requested_archs_present() -> None:
    assert set(TINY_ARCHS) == set(EXPECTED_CLASS)


@pytest.mark.parametrize("arch", ARCHS)
def test_config_shape(arch: str, models) -> None:
    model = models[arch]
    cfg = model.config
    assert type(model).__name__ == EXPECTED_CLASS[arch]
    assert cfg.vocab_size == TINY_VOCAB_SIZE and cfg._attn_implementation == "eager"
    assert model.dtype == torch.float32 and not model.training
    assert 2 <= cfg.num_hidden_layers <= 3 and 32 <= cfg.hidden_size <= 64
    if arch == "llama":
        assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    if arch == "llama-mqa":
        assert cfg.num_key_value_heads == 1
    if arch in ("llama-wide-heads", "gemma3"):
        assert cfg.num_attention_heads * cfg.head_dim != cfg.hidden_size
    if arch == "gpt-neox":
        assert cfg.use_parallel_residual
    if arch == "gpt-neox-seq":
        assert not cfg.use_parallel_residual
    if arch == "gemma2":
        assert cfg.final_logit_softcapping and cfg.attn_logit_softcapping
        assert "sliding_attention" in cfg.layer_types and "full_attention" in cfg.layer_types
    if arch == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    if arch == "phi3":
        assert hasattr(model.model.layers[0].self_attn, "qkv_proj")
        assert hasattr(model.model.layers[0].mlp, "gate_up_proj")


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_finite_and_not_degenerate(arch: str, models, tiny_tokenizer) -> None:
    batch = tiny_tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = models[arch](**batch).logits  # [batch, seq, vocab]
    assert torch.isfinite(logits).all()
    real = logits[batch.attention_mask.bool()]  # [n_real_tokens, vocab]
    assert real.std(dim=-1).min() > 0.5  # logits vary across the vocabulary
    assert real.abs().max() < 100
    probs = real.softmax(dim=-1)
    assert probs.max(dim=-1).values.median() < 0.9  # not one-hot everywhere
    assert real.argmax(dim=-1).unique().numel() > 1  # prediction depends on the input


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_right_padding_is_exact(arch: str, attn: str, tiny_tokenizer, device: str) -> None:
    """Each sequence's last real logits in a right-padded batch equal those of the sequence alone."""
    model = make_tiny_model(arch).to(device)
    if attn != "eager":
        try:
            model.set_attn_implementation(attn)
        except ValueError as err:  # Gemma2 has no SDPA path
            pytest.skip(str(err).splitlines()[0][:80])
    padded, alone = _last_real_logits(model, tiny_tokenizer, TEXTS, device)
    # float32 differences from batch-shape-dependent kernels are ~5e-6 on CPU; masking errors are >1e-2.
    atol = 1e-5 if device == "cpu" else 1e-4
    torch.testing.assert_close(padded, alone, atol=atol, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_save_reload_round_trip(arch: str, tiny_model_dir, tiny_tokenizer) -> None:
    path = tiny_model_dir(arch)
    ref = make_tiny_model(arch)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.padding_side == "right" and len(tok) == len(tiny_tokenizer)
    assert tok(TEXTS).input_ids == tiny_tokenizer(TEXTS).input_ids
    text = "12 + 345 = 357\né  x\r\nÅ"
    assert tok(text).input_ids == tiny_tokenizer(text).input_ids and tok.decode(tok(text).input_ids) == text
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    real = batch.attention_mask.bool()  # [batch, seq]; pad-position logits are impl-dependent garbage
    with torch.no_grad():
        expected = ref(**batch).logits[real]  # [n_real, vocab]
        # The attention implementation is not saved: a plain reload picks SDPA where supported.
        plain = AutoModelForCausalLM.from_pretrained(path)
        ref_sd, plain_sd = ref.state_dict(), plain.state_dict()
        assert ref_sd.keys() == plain_sd.keys()
        assert all(torch.equal(ref_sd[k], plain_sd[k]) for k in ref_sd)
        assert plain.dtype == torch.float32 and type(plain) is type(ref)
        torch.testing.assert_close(plain(**batch).logits[real], expected, atol=1e-5, rtol=0)
        eager = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
        assert torch.equal(eager(**batch).logits[real], expected)


@pytest.mark.parametrize("arch", ARCHS)
def test_seed_determinism(arch: str) -> None:
    a, b, c = make_tiny_model(arch, seed=0), make_tiny_model(arch, seed=0), make_tiny_model(arch, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    params = dict(a.named_parameters())
    assert all(not torch.equal(params[k], sc[k]) for k in params)  # every parameter re-drawn


def test_make_tiny_model_leaves_global_rng_unchanged() -> None:
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    py_before, np_before = random.getstate(), np.random.get_state()
    make_tiny_model("llama", seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    assert random.getstate() == py_before
    assert np.array_equal(np.random.get_state()[1], np_before[1])


def test_gemma_norm_weights_centred_on_zero(models) -> None:
    """Gemma RMSNorm scales by (1 + w): weights near 0; Llama's by w: weights near 1."""
    g = models["gemma"].model.norm.weight
    assert g.abs().mean() < 0.3
    l_ = models["llama"].model.norm.weight
    assert (l_ - 1).abs().mean() < 0.3


def test_seed_fixture_restores_rng(seed: int) -> None:
    assert seed == 0
    assert torch.equal(torch.get_rng_state(), torch.random.manual_seed(0).get_state())


def test_device_fixture(device: str) -> None:
    assert torch.zeros(1, device=device).device.type == torch.device(device).type


def test_tokenizer_factory_is_fresh() -> None:
    assert make_tiny_tokenizer() is not make_tiny_tokenizer()
