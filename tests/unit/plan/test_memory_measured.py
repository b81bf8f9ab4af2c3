"""The planned peak against the measured one, on a small random-init Llama run by the engines themselves.

Measured: the CPU allocator's peak of live tensor bytes inside the call (tests/allocation_peak.py), above the
weights already loaded; planned: `MemoryPlan.peak` less the weights. Both count tensors only, so they compare
like with like. The model (4 layers x 256, 8 query / 2 key-value heads, MLP 688, vocabulary 4096) keeps the
proportions of a real decoder at a size a CPU test affords, with grouped-query attention.

Tolerance: the plan may be up to 25 % above the measurement and 15 % below it. Above: the plan sums parts the
allocator frees in between (a layer's attention and MLP temporaries, precise SFT's hooks planned on every layer);
below: small tensors it does not name (masks, rotary tables, index tensors), a few per cent of these sizes and
less at real widths, where the named terms grow with d_model and d_vocab.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from allocation_peak import peak_allocated
from arithmech.finetune.data import TokenizedExample
from arithmech.finetune.methods import make_trainable
from arithmech.finetune.train import accelerator_for, train
from arithmech.models.archs import spec_for_model_type
from arithmech.models.sites import Component
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch, path_patch
from arithmech.plan import memory
from arithmech.plan.shape_sources import shape_from_config
from arithmech.stages.finetune_config import FinetuneConfig

from tiny_models import seeded_rng

pytestmark = pytest.mark.usefixtures("one_thread")
B, T, VOCAB = 8, 48, 4096
ABOVE, BELOW = 1.25, 0.85


def _config() -> LlamaConfig:
    return LlamaConfig(
        hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=128, attn_implementation="eager", use_cache=False,
        tie_word_embeddings=False,
    )  # fmt: skip


def _view(training: bool = False) -> ModelView:
    with seeded_rng(0):
        model = AutoModelForCausalLM.from_config(_config())
    return ModelView(model.train(training), spec_for_model_type("llama"))


def _check(planned: int, measured: int) -> None:
    assert BELOW * measured <= planned <= ABOVE * measured, f"planned {planned:,} B, measured {measured:,} B"


@pytest.mark.parametrize("variant", ["path", "total"])
def test_identify_scan_peak_is_planned(variant: str) -> None:
    view = _view()
    gen = torch.Generator().manual_seed(0)
    ref = torch.randint(3, VOCAB, (B, T), generator=gen)
    cf, mask = ref.clone(), torch.ones_like(ref)
    cf[:, T - 5] = (cf[:, T - 5] + 1) % VOCAB  # the query's operator, as the planner assumes
    batch = PatchingBatch(ref, mask, cf, mask.clone(), torch.full((B,), T - 1), torch.randint(3, VOCAB, (B,)))
    measured = peak_allocated(lambda: path_patch(view, batch, variant, batch_size=B))
    shape = shape_from_config(_config().to_dict(), "test", "test")
    plan = memory.scan_memory(shape, 4, B, T, variant)
    _check(plan.peak - plan.weights, measured)


@pytest.mark.parametrize("method", ["full", "precise"])
def test_finetune_steps_peak_is_planned(method: str, tmp_path: Path) -> None:
    """Two optimizer steps, so that the second runs with AdamW's moments allocated (the steady state planned)."""
    view = _view(training=True)
    heads = [Component(0, 2), Component(3, 0)] if method == "precise" else None
    trainable = make_trainable(method, view, heads=heads)
    trained = sum(p.numel() for _, p in trainable.trainable_named())
    gen = torch.Generator().manual_seed(0)
    data = [TokenizedExample(str(i), tuple(torch.randint(3, VOCAB, (T,), generator=gen).tolist()), T // 2)
            for i in range(B)]  # fmt: skip
    cfg = FinetuneConfig(method=method, components=("0.2",), max_steps=2, batch_size=B, micro_batch_size=B,
                         checkpoint_every=0, warmup_ratio=0.0)  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        measured = peak_allocated(
            lambda: train(accelerator_for(torch.device("cpu")), trainable, data, 0, cfg, Path(out), {}, quiet=True)
        )
    shape = shape_from_config(_config().to_dict(), "test", "test")
    plan = memory.training_memory(shape, 4, B, T, method, trained)
    _check(plan.peak - memory.weight_bytes(shape, 4), measured)
