"""The weights' fingerprint (evaluate's cache key) tells checkpoints apart, and sums a large tensor in chunks: a
float64 copy of a whole 128k-vocabulary embedding would take 4 GiB beside the model (issue 33's skeletons)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from arithmech.stages import evaluate

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from allocation_peak import peak_allocated  # noqa: E402


def test_a_changed_weight_changes_the_fingerprint_and_a_copy_does_not() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 4))
    before = evaluate.model_fingerprint(model)
    twin = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 4))
    twin.load_state_dict(model.state_dict())
    assert evaluate.model_fingerprint(twin) == before
    with torch.no_grad():
        model[1].weight[0, 0] += 1e-3
    assert evaluate.model_fingerprint(model) != before


def test_a_tensor_larger_than_a_chunk_is_summed_without_a_float64_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluate, "FINGERPRINT_CHUNK", 1 << 12)
    model = torch.nn.Embedding(1 << 10, 1 << 8).to(torch.bfloat16)  # 256k elements: 2 MiB as float64
    chunked: list[str] = []
    peak = peak_allocated(lambda: chunked.append(evaluate.model_fingerprint(model)))
    assert peak <= 4 * (1 << 12) * 8  # a chunk's float64 copy and its sum, not the tensor's
    monkeypatch.setattr(evaluate, "FINGERPRINT_CHUNK", 1 << 30)
    assert evaluate.model_fingerprint(model) == chunked[0]  # the same key as summed whole: kept caches stay valid


def test_the_plan_counts_the_checksum_chunk() -> None:
    from arithmech.plan import memory

    assert memory.FINGERPRINT_CHUNK == evaluate.FINGERPRINT_CHUNK
