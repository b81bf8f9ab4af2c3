"""Repeated scans in one process keep memory flat and leave no hooks behind.

Each scan (path patching, batched knockout, causal mediation) runs 20 times on a tiny model. After calls 5
and 20 (gc.collect() and malloc_trim first) the process's resident set size and the number of live tensors are
read: from call 5 on neither may grow (RSS by less than `RSS_SLACK`, allowing allocator noise), and no module
may keep a hook. A control leaks 1 MB per call and must be caught by the same measurement, so the check can fail.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from arithmech.data import GenerationConfig, generate_pairs, tokenize_pairs
from arithmech.data.mediation_generate import generate_mediation_pairs
from arithmech.data.mediation_prompts import MediationDataConfig
from arithmech.data.mediation_tokens import tokenize_mediation_pairs
from arithmech.knockout.ablation import ablation_sources, alignment_groups
from arithmech.knockout.batched import knockout_scores
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.models.sites import Component
from arithmech.patching.mediation import mediation_effects
from arithmech.patching.path import PatchingBatch, path_patch

pytestmark = pytest.mark.usefixtures("one_thread")

CALLS, WARMUP = 20, 5
RSS_SLACK = 2 * 2**20  # bytes; measured growth without a leak: < 0.1 MB
STATM = Path("/proc/self/statm")


def rss() -> int:
    """Current resident set size in bytes (Linux), else the peak one (which also rises with any growth).

    glibc's malloc_trim first hands freed heap pages back, so the number counts live memory, not the allocator's
    free lists (without it, RSS wanders by a few MB with no leak at all).
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    if STATM.exists():
        return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def live_tensors() -> int:
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor))  # type(): no lazy attributes


def growth(scan: Callable[[], Any]) -> tuple[int, int]:
    """(RSS growth in bytes, live-tensor growth) from call WARMUP to call CALLS of `scan`."""
    before = (0, 0)
    for call in range(1, CALLS + 1):
        scan()
        if call in (WARMUP, CALLS):
            gc.collect()
            now = (rss(), live_tensors())
            if call == WARMUP:
                before = now
    return now[0] - before[0], now[1] - before[1]


@pytest.fixture(scope="module")
def handle(tiny_model_dir) -> ModelHandle:
    return load_model(ModelConfig(model=str(tiny_model_dir("llama"))))


@pytest.fixture(scope="module")
def batch(handle: ModelHandle) -> tuple[PatchingBatch, list[int]]:
    """About 20 addition prompts (3 solved examples each) and their alignment groups."""
    pairs = generate_pairs(GenerationConfig(operations=("addition",), n_per_template=4, few_shot=3))
    t, _ = tokenize_pairs(handle.tokenizer, pairs)
    groups = alignment_groups([p.template_id for p in t.pairs], t.end + 1)
    return PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids), groups


def check_flat(handle: ModelHandle, scan: Callable[[], Any]) -> None:
    rss_growth, tensor_growth = growth(scan)
    assert tensor_growth <= 0, f"{tensor_growth} more live tensors after {CALLS - WARMUP} more calls"
    assert rss_growth < RSS_SLACK, f"RSS grew by {rss_growth / 2**20:.1f} MB over {CALLS - WARMUP} calls"
    assert count_hooks(handle.model) == 0


def test_path_patching_memory_is_flat(handle: ModelHandle, batch: tuple[PatchingBatch, list[int]]) -> None:
    prompts, _ = batch
    assert len(prompts) >= 16
    check_flat(handle, lambda: path_patch(handle.view, prompts, "path", batch_size=8))


def test_knockout_memory_is_flat(handle: ModelHandle, batch: tuple[PatchingBatch, list[int]]) -> None:
    prompts, groups = batch
    configs = [[], [Component(0, 1)], [Component(1, 0), Component(2)], [Component(2, 3), Component(0)]]

    def scan() -> Any:
        sources = ablation_sources(handle.view, prompts, "mean", groups)
        return knockout_scores(handle.view, prompts, sources, configs, batch_size=32)

    check_flat(handle, scan)


def test_mediation_memory_is_flat(handle: ModelHandle) -> None:
    cfg = MediationDataConfig(tasks=("addition",), n_per_template=1, few_shot=1)
    items, _ = tokenize_mediation_pairs(handle.tokenizer, generate_mediation_pairs(cfg)[:2])
    assert items
    check_flat(handle, lambda: mediation_effects(handle.view, items, max_rows=4))


def test_a_leak_is_caught(handle: ModelHandle) -> None:
    kept: list[torch.Tensor] = []

    def leaky() -> None:
        kept.append(torch.ones(2**18))  # 1 MB per call, never released

    rss_growth, tensor_growth = growth(leaky)
    assert tensor_growth == CALLS - WARMUP and rss_growth >= RSS_SLACK
