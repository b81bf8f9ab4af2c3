"""The result of fine-tuning as a small delta on the base model, and the merged model in Hugging Face format.

A delta is two files in a folder:
    delta.safetensors   one tensor per entry: the trained values
    delta.json          the manifest: format and version, the base model, and per entry the tensor key, the
                        parameter's dotted name in the base model, and which entries it replaces (`dim` and
                        `ranges` [[start, stop), ...] of positions along dim; both null = the whole parameter)
The values are the trained entries themselves, not differences, so `apply_delta` reproduces the trained model
bit for bit (a difference added back would round). For precise SFT this is the selected rows/columns and MLPs
only, a few MB for a 7B model; for full SFT it is every parameter; for LoRA the merged attention projections.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from arithmech.errors import DataError
from arithmech.finetune.head_slices import DeltaEntry
from arithmech.runs import atomic_open, atomic_write_json, staging_folder

DELTA_FORMAT = "arithmech-delta"
DELTA_VERSION = 1
TENSORS_FILE = "delta.safetensors"
MANIFEST_FILE = "delta.json"


def _ranges(index: Sequence[int]) -> list[list[int]]:
    """Sorted positions -> [[start, stop), ...] runs."""
    runs: list[list[int]] = []
    for i in index:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def _positions(ranges: list[list[int]]) -> list[int]:
    return [i for start, stop in ranges for i in range(start, stop)]


def save_delta(entries: list[DeltaEntry], out_dir: str | os.PathLike[str], extra: dict[str, Any] | None = None) -> Path:
    """Write delta.safetensors, then delta.json (both atomically); return the folder."""
    from safetensors.torch import save as save_tensors

    out = Path(out_dir)
    tensors, manifest = {}, []
    for i, entry in enumerate(entries):
        key = f"t{i:05d}"
        tensors[key] = entry.values.detach().cpu().contiguous()
        manifest.append(
            {
                "tensor": key,
                "parameter": entry.parameter,
                "dim": entry.dim,
                "ranges": None if entry.index is None else _ranges(entry.index),
                "shape": list(entry.values.shape),
                "dtype": str(entry.values.dtype).removeprefix("torch."),
            }
        )
    with atomic_open(out / TENSORS_FILE, "wb") as handle:
        handle.write(save_tensors(tensors))
    atomic_write_json(
        out / MANIFEST_FILE,
        {"format": DELTA_FORMAT, "version": DELTA_VERSION, **(extra or {}), "entries": manifest},
    )
    return out


def read_delta(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(manifest, tensors) of a delta folder (or either of its two files)."""
    from safetensors.torch import load_file

    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    manifest_path, tensors_path = folder / MANIFEST_FILE, folder / TENSORS_FILE
    if not manifest_path.is_file() or not tensors_path.is_file():
        raise DataError(f"{folder} holds no {MANIFEST_FILE} and {TENSORS_FILE}; give the output folder of finetune")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != DELTA_FORMAT or manifest.get("version") != DELTA_VERSION:
        raise DataError(f"{manifest_path} is not an {DELTA_FORMAT} v{DELTA_VERSION} manifest")
    return manifest, load_file(str(tensors_path))


def delta_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What evaluate's metadata.json records of the delta it applied: its folder, method, the model it was trained
    on and how many weight tensors (or slices of one) it sets."""
    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    trained_on = manifest.get("base_model", {}).get("model")
    return {"path": str(folder.resolve()), "method": manifest.get("method"), "trained_on": trained_on,
            "tensors": len(manifest["entries"])}  # fmt: skip


@torch.no_grad()
def apply_delta(model: nn.Module, path: str | os.PathLike[str]) -> nn.Module:
    """Overwrite the entries a delta names with its trained values, in place; return `model`."""
    manifest, tensors = read_delta(path)
    trained_on = manifest.get("base_model", {}).get("model_type")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if trained_on and model_type and trained_on != model_type:
        raise DataError(
            f"the delta was trained on a {trained_on} model, not {model_type}; apply the delta to the model it was "
            "trained on"
        )
    for entry in manifest["entries"]:
        try:
            param = model.get_parameter(entry["parameter"])
        except AttributeError:
            raise DataError(
                f"the model has no parameter {entry['parameter']!r}; apply the delta to the model it was trained on"
            ) from None
        values = tensors[entry["tensor"]].to(device=param.device, dtype=param.dtype)
        if entry["ranges"] is None:
            if values.shape != param.shape:
                raise DataError(f"delta entry {entry['parameter']} has shape {list(values.shape)}, the model "
                                f"{list(param.shape)}; apply the delta to the model it was trained on")
            param.copy_(values)
            continue
        dim, index = entry["dim"], torch.tensor(_positions(entry["ranges"]), device=param.device)
        expected = list(param.shape)
        expected[dim] = len(index)
        if list(values.shape) != expected or int(index.max()) >= param.shape[dim]:
            raise DataError(f"delta entry {entry['parameter']} does not fit the model's shape {list(param.shape)}; "
                            "apply the delta to the model it was trained on")
        param.index_copy_(dim, index, values)
    return model


@contextmanager
def atomic_folder(target: str | os.PathLike[str]) -> Iterator[Path]:
    """A staging folder beside `target` that replaces `target` when the block succeeds (removed on error)."""
    final = Path(target)
    staging = staging_folder(final)
    try:
        yield staging
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def save_merged(model: Any, tokenizer: Any, out_dir: str | os.PathLike[str]) -> Path:
    """The whole trained model and its tokenizer in Hugging Face format, appearing atomically at `out_dir`."""
    with atomic_folder(out_dir) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    return Path(out_dir)
