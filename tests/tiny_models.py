"""Tiny random-init causal LMs of every supported architecture, for unit tests.

Background
----------
Unit tests must not download checkpoints, yet path patching has to be exercised on
every family the package supports: GQA/MQA Llama, Mistral, Qwen2 (q/k/v biases),
Gemma 1/2/3 (``1 + weight`` RMSNorm, sandwich norms, soft-capping, sliding windows,
``n_heads * head_dim != d_model``), GPT-2 (``Conv1D`` weights), GPT-NeoX (parallel and
sequential residual) and Phi-3 (fused ``qkv_proj`` / ``gate_up_proj``).

Each model here is 2-3 layers with ``d_model`` 32-64 and shares one byte-level
tokenizer (:func:`make_tiny_tokenizer`, 256 byte tokens + ``<|pad|>`` + ``<|eos|>``,
so every digit is one token, as in SmolLM2). Weights are re-initialised with a
larger spread than HF's ``initializer_range=0.02`` so that the networks are truly
nonlinear and patching effects are clearly non-zero:

* ``Linear`` / ``Conv1D`` weight ~ N(0, (gain / sqrt(fan_in))^2), gain = ``_GAIN``;
* biases ~ N(0, ``_BIAS_STD``^2);
* embeddings ~ N(0, (gain / sqrt(d_model))^2), so tied and untied logits have std ~ gain;
* norm weights = identity value + N(0, ``_NORM_NOISE``^2); the identity value is
  found by probing the norm (1 for ``w * x`` norms, 0 for Gemma's ``(1 + w) * x``).

Usage
-----
>>> from tiny_models import TINY_ARCHS, make_tiny_model, make_tiny_tokenizer
>>> tok = make_tiny_tokenizer()
>>> model = make_tiny_model("gemma2", seed=0)
>>> batch = tok(["12+34=", "7+8="], return_tensors="pt", padding=True)
>>> logits = model(**batch).logits  # [batch=2, seq=6, vocab=258]

``save_tiny_model_dir(arch, path)`` writes model + tokenizer so that
``AutoModelForCausalLM.from_pretrained(path)`` / ``AutoTokenizer.from_pretrained(path)``
reload them (this is what the ``tiny_model_dir`` fixture in ``conftest.py`` uses). Caveats:

* the attention implementation is not saved; a plain reload picks SDPA where the arch supports
  it (weights bit-identical, logits within ~1e-5); pass ``attn_implementation="eager"`` for
  bit-identical logits;
* a qwen2 dir reloads as ``Qwen2Tokenizer``, which swaps in NFC normalisation and Qwen's split
  regex: ids are identical unless the text has non-NFC unicode;
* logits at pad positions are garbage and differ between eager and SDPA (rows that are fully
  masked in sliding-window layers); read only real positions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)
from transformers.pytorch_utils import Conv1D

__all__ = [
    "EOS_TOKEN",
    "MULTIDIGIT_VOCAB_SIZE",
    "PAD_TOKEN",
    "TINY_ARCHS",
    "TINY_VOCAB_SIZE",
    "make_tiny_model",
    "make_multidigit_tokenizer",
    "make_tiny_tokenizer",
    "save_multidigit_model_dir",
    "save_tiny_model_dir",
    "seeded_rng",
    "single_thread",
]

# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|eos|>"
TINY_VOCAB_SIZE = 258  # 256 bytes + pad + eos
PAD_ID = 256
EOS_ID = 257


def _byte_symbols() -> list[str]:
    """The 256 ByteLevel symbols ordered so that token id == byte value (GPT-2's bytes_to_unicode)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    ordered = [symbols[b] for b in range(256)]
    assert sorted(ordered) == sorted(pre_tokenizers.ByteLevel.alphabet())
    return ordered


def make_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE with no merges: one token per byte, id == byte value (``"0"`` -> 48).

    Special tokens: ``<|pad|>`` (256) and ``<|eos|>`` (257); no BOS is added.
    ``padding_side="right"``. ``len(tokenizer) == TINY_VOCAB_SIZE == 258``.
    """
    vocab = {sym: i for i, sym in enumerate(_byte_symbols())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([PAD_TOKEN, EOS_TOKEN])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        # Saved as `"unk_token": null`: AutoTokenizer loads a qwen2 dir as Qwen2Tokenizer, whose default
        # unk "<|endoftext|>" would otherwise be added as a 259th token.
        unk_token=None,
        padding_side="right",
        model_max_length=128,
    )
    assert fast.pad_token_id == PAD_ID and fast.eos_token_id == EOS_ID, (fast.pad_token_id, fast.eos_token_id)
    assert len(fast) == TINY_VOCAB_SIZE, len(fast)
    return fast


# ---------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------

_MAX_POS = 128
_SLIDING_WINDOW = 8  # small enough that the sliding mask actually bites on longer test prompts
_COMMON = {
    "vocab_size": TINY_VOCAB_SIZE,
    "pad_token_id": PAD_ID,
    "eos_token_id": EOS_ID,
    "bos_token_id": None,
    "attn_implementation": "eager",
    "use_cache": False,
}


def _llama() -> PretrainedConfig:
    return LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2,  # GQA: 2 query heads per kv head
        max_position_embeddings=_MAX_POS, tie_word_embeddings=False, **_COMMON,
    )  # fmt: skip


def _llama_mqa() -> PretrainedConfig:
    return LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1,  # MQA
        max_position_embeddings=_MAX_POS, tie_word_embeddings=False, **_COMMON,
    )  # fmt: skip


def _llama_wide_heads() -> PretrainedConfig:
    return LlamaConfig(
        hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,  # 4 * 16 = 64 != 48
        max_position_embeddings=_MAX_POS, tie_word_embeddings=False, **_COMMON,
    )  # fmt: skip


def _mistral() -> PretrainedConfig:
    return MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=None,
        max_position_embeddings=_MAX_POS, tie_word_embeddings=False, **_COMMON,
    )  # fmt: skip


def _qwen2() -> PretrainedConfig:
    # Qwen2 always has q/k/v biases (o_proj has none).
    return Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=_MAX_POS, tie_word_embeddings=True, **_COMMON,
    )  # fmt: skip


def _gemma() -> PretrainedConfig:
    return GemmaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=_MAX_POS, tie_word_embeddings=True, **_COMMON,
    )  # fmt: skip


def _gemma2() -> PretrainedConfig:
    return Gemma2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        # Caps scaled down from the real 50 / 30 so that tanh is non-trivial at tiny-model magnitudes.
        attn_logit_softcapping=5.0, final_logit_softcapping=5.0,
        sliding_window=_SLIDING_WINDOW, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=_MAX_POS, tie_word_embeddings=True, **_COMMON,
    )  # fmt: skip


def _gemma3() -> PretrainedConfig:
    return Gemma3TextConfig(
        hidden_size=48, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,  # 4 * 16 = 64 != 48
        query_pre_attn_scalar=16,
        sliding_window=_SLIDING_WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=_MAX_POS, tie_word_embeddings=True, **_COMMON,
    )  # fmt: skip


def _gpt2() -> PretrainedConfig:
    return GPT2Config(
        n_embd=32, n_layer=2, n_head=4, n_inner=128, n_positions=_MAX_POS,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
        tie_word_embeddings=True, **_COMMON,
    )  # fmt: skip


def _gpt_neox(parallel: bool) -> Callable[[], PretrainedConfig]:
    def build() -> PretrainedConfig:
        return GPTNeoXConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            use_parallel_residual=parallel, attention_dropout=0.0, hidden_dropout=0.0,
            max_position_embeddings=_MAX_POS, tie_word_embeddings=False, **_COMMON,
        )  # fmt: skip

    return build


def _phi3() -> PretrainedConfig:
    return Phi3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
        max_position_embeddings=_MAX_POS, original_max_position_embeddings=_MAX_POS,
        tie_word_embeddings=False, **_COMMON,
    )  # fmt: skip


TINY_ARCHS: dict[str, Callable[[], PretrainedConfig]] = {
    "llama": _llama,
    "llama-mqa": _llama_mqa,
    "llama-wide-heads": _llama_wide_heads,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "gpt2": _gpt2,
    "gpt-neox": _gpt_neox(parallel=True),
    "gpt-neox-seq": _gpt_neox(parallel=False),
    "phi3": _phi3,
}


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

_GAIN = 1.5
_BIAS_STD = 0.05
_NORM_NOISE = 0.1


@contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Seed torch (CPU and CUDA), ``random`` and numpy inside the block; restore the caller's states after."""
    py_state = random.getstate()
    np_state = np.random.get_state()
    cuda_devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=cuda_devices):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


@contextmanager
def single_thread() -> Iterator[None]:
    """Torch on one thread inside the block, the caller's thread count after.

    Tiny models run far faster on one thread; on a busy machine OpenMP spinning slows them many times over.
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _norm_identity_value(norm: nn.Module) -> float:
    """1.0 for ``w * x_hat`` norms, 0.0 for Gemma's ``(1 + w) * x_hat``, found by zeroing ``w``."""
    weight = norm.weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.zero_()
        bias = getattr(norm, "bias", None)
        saved_bias = bias.detach().clone() if isinstance(bias, torch.Tensor) else None
        if saved_bias is not None:
            bias.zero_()
        probe = torch.linspace(-1.0, 1.0, weight.shape[-1]).reshape(1, -1)  # [1, dim]
        out = norm(probe)
        weight.copy_(saved)
        if saved_bias is not None:
            bias.copy_(saved_bias)
    return 0.0 if out.abs().max().item() > 0 else 1.0


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


@torch.no_grad()
def _reinit_(model: PreTrainedModel) -> None:
    """Re-initialise every parameter in place; fails loudly on a parameter type it does not know."""
    seen: set[int] = set()
    for module in model.modules():
        params = dict(module.named_parameters(recurse=False))
        if not params:
            continue
        if isinstance(module, nn.Embedding):  # also the unembedding when tied: logits std ~ _GAIN
            kinds = {"weight": ("normal", _GAIN / math.sqrt(module.embedding_dim))}
        elif isinstance(module, (nn.Linear, Conv1D)):
            # Linear weight is [out, in]; GPT-2's Conv1D weight is [in, out].
            fan_in = module.in_features if isinstance(module, nn.Linear) else module.weight.shape[0]
            kinds = {"weight": ("normal", _GAIN / math.sqrt(fan_in)), "bias": ("normal", _BIAS_STD)}
        elif _is_norm(module):
            base = _norm_identity_value(module)
            kinds = {"weight": ("around", base), "bias": ("normal", _BIAS_STD)}
        else:
            raise TypeError(f"tiny_models: no init rule for {type(module).__name__} params {list(params)}")
        for name, param in params.items():
            if id(param) in seen:  # tied embeddings: initialise once
                continue
            seen.add(id(param))
            if name not in kinds:
                raise TypeError(f"tiny_models: no init rule for {type(module).__name__}.{name}")
            rule, value = kinds[name]
            if rule == "normal":
                param.normal_(0.0, value)
            else:
                param.fill_(value).add_(torch.randn_like(param) * _NORM_NOISE)


@cache
def _tiny_tokenizer_cached() -> PreTrainedTokenizerFast:
    return make_tiny_tokenizer()


def make_tiny_model(arch: str, seed: int = 0) -> PreTrainedModel:
    """Build the ``arch`` model of :data:`TINY_ARCHS` with seeded, widened random weights.

    float32, ``.eval()``, on CPU. The global torch RNG state is left unchanged.
    """
    if arch not in TINY_ARCHS:
        raise KeyError(f"unknown tiny arch {arch!r}; choose from {sorted(TINY_ARCHS)}")
    config = TINY_ARCHS[arch]()
    with seeded_rng(seed):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _reinit_(model)
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    return model.eval()


def save_tiny_model_dir(arch: str, path: str | Path, seed: int = 0) -> Path:
    """Save ``make_tiny_model(arch, seed)`` and the tiny tokenizer into ``path``; return ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    make_tiny_model(arch, seed).save_pretrained(path)
    _tiny_tokenizer_cached().save_pretrained(path)
    return path


# ---------------------------------------------------------------------------
# A tokenizer with multi-digit number tokens (issue #15)
# ---------------------------------------------------------------------------

MULTIDIGIT_VOCAB_SIZE = TINY_VOCAB_SIZE + 90  # + one token per number 10..99


def make_multidigit_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level tokenizer plus one merged token for each number 10..99 (ids 256..345; pad 346, eos 347).

    So 0..99 are single tokens and 100 is "10" + "0": the single-token numbers are 0..99, as on tokenizers
    with multi-digit number tokens (Llama 3 has 0..999). ``len(tokenizer) == MULTIDIGIT_VOCAB_SIZE``.
    """
    symbols = _byte_symbols()
    vocab = {sym: i for i, sym in enumerate(symbols)}
    merges = [(symbols[ord(str(a))], symbols[ord(str(b))]) for a in range(1, 10) for b in range(10)]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([PAD_TOKEN, EOS_TOKEN])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, unk_token=None,
                                   padding_side="right", model_max_length=128)  # fmt: skip
    assert len(fast) == MULTIDIGIT_VOCAB_SIZE, len(fast)
    return fast


def make_multidigit_model(arch: str, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny ``arch`` model (float32, eval mode) with the multi-digit tokenizer's vocabulary, and that tokenizer."""
    tokenizer = make_multidigit_tokenizer()
    config = TINY_ARCHS[arch]()
    config.vocab_size = MULTIDIGIT_VOCAB_SIZE
    config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    with seeded_rng(seed):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _reinit_(model)
    return model.eval(), tokenizer


def save_multidigit_model_dir(arch: str, path: str | Path, seed: int = 0) -> Path:
    """A tiny ``arch`` model with the multi-digit tokenizer's vocabulary, saved with it into ``path``."""
    model, tokenizer = make_multidigit_model(arch, seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
