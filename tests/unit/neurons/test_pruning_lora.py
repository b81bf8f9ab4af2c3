"""Neuron pruning (neurons/pruning.py) and LoRA analysis (neurons/lora_*.py) on tiny random llama and gpt2 models.

References are plain: pruning is checked against a hand-written pre-hook that gates the down projection's input
(found by name, not through the library), and LoRA coefficients and LIs against a deep copy of the model with the
adapter merged into its weights by peft (`merge_and_unload`).
"""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from arithmech.errors import ConfigError
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import count_hooks
from arithmech.models.load import ModelHandle
from arithmech.models.view import ModelView
from arithmech.neurons.coefficients import end_coefficients
from arithmech.neurons.log_increase import neuron_li
from arithmech.neurons.lora_adapter import applied_lora
from arithmech.neurons.lora_effect import coefficient_change
from arithmech.neurons.lora_train import LoraTrainConfig, answer_loss, target_module_names, train_layer_lora
from arithmech.neurons.pruning import (
    pruned_predictions,
    pruning_sweep,
    random_keep_sets,
    top_keep_sets,
)
from arithmech.stages.neurons_config import check_adapter_folder

from forward_cost import count_layer_tokens
from tiny_models import PAD_ID, make_tiny_model

ARCHS = ["llama", "gpt2"]
DOWN = {"llama": "mlp.down_proj", "gpt2": "mlp.c_proj"}
TOL = {"atol": 1e-5, "rtol": 1e-5}


def handle_of(arch: str) -> ModelHandle:
    model = make_tiny_model(arch, seed=0)
    return ModelHandle(model, None, ModelView(model, spec_for_model_type(model.config.model_type)))


def prompts(n: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Byte-level "a+b=" prompts, right-padded: (ids, mask, end, first digit of the answer)."""
    gen = torch.Generator().manual_seed(seed)
    pairs = torch.randint(0, 60, (n, 2), generator=gen).tolist()
    texts = [(f"{a}+{b}=", str(a + b)) for a, b in pairs]
    width = max(len(t) for t, _ in texts)
    ids = torch.full((n, width), PAD_ID)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, (text, _) in enumerate(texts):
        ids[i, : len(text)] = torch.tensor(list(text.encode()))
        mask[i, : len(text)] = 1
    end = mask.sum(1) - 1
    answers = torch.tensor([ord(answer[0]) for _, answer in texts])
    return ids, mask, end, answers


@torch.no_grad()
def plain_end_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return logits[torch.arange(len(end)), end]  # [row, d_vocab]


def gated_end_logits(model: Any, arch: str, layers: list[int], keep: dict[int, list[int]], batch: Any) -> torch.Tensor:
    """END logits with a hand-written pre-hook multiplying each layer's neuron activations by a 0/1 gate."""
    blocks = model.model.layers if arch == "llama" else model.transformer.h
    handles = []
    for layer in layers:
        module = blocks[layer].get_submodule(DOWN[arch])
        width = module.weight.shape[0] if arch == "gpt2" else module.weight.shape[1]
        gate = torch.zeros(width)
        gate[keep.get(layer, [])] = 1.0
        handles.append(module.register_forward_pre_hook(lambda _m, args, g=gate: (args[0] * g,)))
    try:
        return plain_end_logits(model, *batch[:3])
    finally:
        for h in handles:
            h.remove()


def scores_for(view: ModelView, layers: list[int], seed: int = 1) -> torch.Tensor:
    width = end_coefficients(view, *prompts(2)[:3], layers).shape[-1]
    return torch.randn(len(layers), width, generator=torch.Generator().manual_seed(seed))


# -- pruning -------------------------------------------------------------------------------------------------
def test_top_keep_sets_global_and_per_layer() -> None:
    scores = torch.tensor([[0.5, 3.0, 1.0, 1.0], [2.0, -1.0, 4.0, 0.0]])
    glob = top_keep_sets(scores, [5, 7], 3, "global")
    assert glob[5].tolist() == [1] and glob[7].tolist() == [0, 2]
    per = top_keep_sets(scores, [5, 7], 2, "per-layer")
    assert per[5].tolist() == [1, 2] and per[7].tolist() == [0, 2]  # tie 1.0 vs 1.0 keeps the lower index
    assert top_keep_sets(scores, [5, 7], 0)[5].numel() == 0
    with pytest.raises(ConfigError, match="keep size 9"):
        top_keep_sets(scores, [5, 7], 9)
    with pytest.raises(ConfigError, match="one row per pruned layer"):
        top_keep_sets(scores, [5], 1)


@pytest.mark.parametrize("arch", ARCHS)
def test_keep_all_is_bit_identical(arch: str) -> None:
    handle = handle_of(arch)
    batch = prompts()
    layers = [0, 1]
    scores = scores_for(handle.view, layers)
    everything = top_keep_sets(scores, layers, scores.numel())
    plain = plain_end_logits(handle.model, *batch[:3])
    from arithmech.neurons.coefficients import mask_neurons

    with mask_neurons(handle.view, everything):
        masked = plain_end_logits(handle.model, *batch[:3])
    assert torch.equal(masked, plain)
    result = pruning_sweep(handle.view, *batch, scores, layers, [scores.numel()], n_random=2)
    assert result.top_accuracy.tolist() == [result.baseline_accuracy]
    assert result.top_prob.tolist() == [result.baseline_prob]
    assert result.random_prob[0].tolist() == [result.baseline_prob] * 2
    base = pruned_predictions(handle.view, *batch, {})
    assert torch.equal(base.answer_prob, plain.softmax(-1)[torch.arange(len(batch[3])), batch[3]])


@pytest.mark.parametrize("arch", ARCHS)
def test_keep_none_equals_zeroed_activations(arch: str) -> None:
    handle = handle_of(arch)
    batch = prompts()
    layers = [0, 1]
    zeroed = gated_end_logits(handle.model, arch, layers, {}, batch)
    assert not torch.allclose(zeroed, plain_end_logits(handle.model, *batch[:3]))
    pred = pruned_predictions(handle.view, *batch, top_keep_sets(scores_for(handle.view, layers), layers, 0))
    rows = torch.arange(len(batch[3]))
    torch.testing.assert_close(pred.answer_prob, zeroed.softmax(-1)[rows, batch[3]], **TOL)
    assert torch.equal(pred.top_token, zeroed.argmax(-1))


@pytest.mark.parametrize(("arch", "selection"), [("llama", "global"), ("gpt2", "per-layer")])
def test_sweep_matches_hand_gated_model(arch: str, selection: str) -> None:
    handle = handle_of(arch)
    batch = prompts()
    layers = [1, 2] if arch == "llama" else [0, 1]
    scores = scores_for(handle.view, layers)
    sizes = [5, 40]
    result = pruning_sweep(handle.view, *batch, scores, layers, sizes, selection=selection, n_random=2, seed=3)
    rows = torch.arange(len(batch[3]))
    for i, k in enumerate(sizes):
        # the reference ranks by hand: top-k of the flattened grid, or of each row
        if selection == "global":
            flat = scores.flatten().argsort(descending=True)[:k]
            keep = {
                layer: (flat[flat // scores.shape[1] == j] % scores.shape[1]).tolist() for j, layer in enumerate(layers)
            }
        else:
            keep = {layer: scores[j].argsort(descending=True)[:k].tolist() for j, layer in enumerate(layers)}
        logits = gated_end_logits(handle.model, arch, layers, keep, batch)
        probs = logits.softmax(-1)[rows, batch[3]]
        assert math.isclose(float(result.top_prob[i]), float(probs.mean()), abs_tol=1e-6)
        assert float(result.top_accuracy[i]) == float((logits.argmax(-1) == batch[3]).float().mean())
        assert result.n_kept(k) == (k if selection == "global" else k * len(layers))
    row = result.rows()[1]
    assert row["random_prob_mean"] == pytest.approx(float(result.random_prob[1].mean()))
    assert row["random_prob_sd"] == pytest.approx(float(result.random_prob[1].std()))
    assert row["fraction_kept"] == pytest.approx(result.n_kept(40) / result.n_neurons)


def test_configurations_start_at_the_first_pruned_layer() -> None:
    """Below the pruned layers only the intact pass runs (and one stand-in row per configuration, as the layers
    need a batch); from the first pruned layer on, every configuration but the baseline, which is the intact
    pass."""
    handle = handle_of("llama")  # 3 layers
    batch = prompts()
    scores = scores_for(handle.view, [2])
    tokens, width = batch[0].numel(), batch[0].shape[1]  # the prompts, padded to the longest: one chunk
    with count_layer_tokens(handle.view) as seen:
        pruning_sweep(handle.view, *batch, scores, [2], [3, 6], n_random=2)
    configurations = 2 * (1 + 2)  # per keep size the top set and 2 random ones
    below = tokens + configurations * width
    assert seen == [below, below, (1 + configurations) * tokens]


def test_random_pruning_reproducible_and_seeded_locally() -> None:
    def draw(seed: int, selection: str) -> list[dict[int, torch.Tensor]]:
        return random_keep_sets([3, 4], 50, [0, 7, 20], selection, torch.Generator().manual_seed(seed))

    for selection in ("global", "per-layer"):
        a, b, c = draw(0, selection), draw(0, selection), draw(1, selection)
        assert all(torch.equal(x[layer], y[layer]) for x, y in zip(a, b, strict=True) for layer in (3, 4))
        assert any(not torch.equal(x[layer], y[layer]) for x, y in zip(a, c, strict=True) for layer in (3, 4))
        sizes = [sum(len(v) for v in s.values()) for s in a]
        assert sizes == ([0, 7, 20] if selection == "global" else [0, 14, 40])
        assert set(a[1][3].tolist()) <= set(a[2][3].tolist())  # nested across keep sizes
    handle = handle_of("llama")
    batch = prompts()
    scores = scores_for(handle.view, [1, 2])
    rng_before = torch.get_rng_state()
    runs = [pruning_sweep(handle.view, *batch, scores, [1, 2], [30], n_random=3, seed=s) for s in (5, 5, 6)]
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert torch.equal(runs[0].random_prob, runs[1].random_prob)
    assert not torch.equal(runs[0].random_prob, runs[2].random_prob)
    assert runs[0].random_prob[0].unique().numel() > 1  # the repeats differ from one another


# -- LoRA ----------------------------------------------------------------------------------------------------
def test_target_module_names_follow_the_spec() -> None:
    llama, gpt2 = handle_of("llama").view, handle_of("gpt2").view
    assert target_module_names(llama, [1], ["mlp"]) == [
        f"model.layers.1.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")
    ]
    assert sorted(target_module_names(llama, [0], ["attn"])) == [f"model.layers.0.self_attn.{p}_proj" for p in "koqv"]
    assert target_module_names(gpt2, [0, 1], ["mlp.c_proj"]) == [
        "transformer.h.0.mlp.c_proj",
        "transformer.h.1.mlp.c_proj",
    ]
    assert target_module_names(gpt2, [1], ["attn"]) == ["transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj"]
    with pytest.raises(ConfigError, match="not in block"):
        target_module_names(llama, [0], ["mlp.c_fc"])
    with pytest.raises(ConfigError, match="do not exist"):
        target_module_names(llama, [7], ["mlp"])


def merged_copy(handle: ModelHandle, adapter: Any) -> ModelView:
    """A deep copy of the model with the adapter merged into its weights by peft: the independent reference."""
    from peft import get_peft_model, set_peft_model_state_dict

    model = copy.deepcopy(handle.model)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' is_gradient_checkpointing probe in peft
        peft_model = get_peft_model(model, copy.deepcopy(adapter.config))
    set_peft_model_state_dict(peft_model, adapter.state)
    merged = peft_model.merge_and_unload()
    return ModelView(merged, handle.view.spec)


def snapshot(model: Any) -> dict[str, Any]:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "grad": {k: p.requires_grad for k, p in model.named_parameters()},
        "config": model.config.to_dict(),
        "training": model.training,
        "modules": [type(m).__name__ for m in model.modules()],
    }


def assert_same(model: Any, before: dict[str, Any]) -> None:
    now = snapshot(model)
    assert now["state"].keys() == before["state"].keys()
    assert all(torch.equal(now["state"][k], v) for k, v in before["state"].items())
    assert now["grad"] == before["grad"] and now["config"] == before["config"]
    assert now["training"] == before["training"] and now["modules"] == before["modules"]
    assert count_hooks(model) == 0


@pytest.mark.parametrize(("arch", "modules"), [("llama", ("mlp",)), ("gpt2", ("mlp", "attn"))])
def test_lora_lowers_loss_changes_coefficients_and_restores_base(
    arch: str, modules: tuple[str, ...], tmp_path: Path
) -> None:
    handle = handle_of(arch)
    ids, mask, end, answers = prompts(16)
    before = snapshot(handle.model)
    plain = plain_end_logits(handle.model, ids, mask, end)
    rng_before = torch.get_rng_state()
    with torch.no_grad():
        loss_before = float(answer_loss(handle.view, ids, mask, end, answers))
    cfg = LoraTrainConfig(layers=(0,), modules=modules, rank=2, steps=12, lr=2e-2, batch_size=8, seed=0)
    adapter = train_layer_lora(handle, ids, mask, end, answers, cfg)
    assert len(adapter.losses) == 12 and adapter.state
    assert_same(handle.model, before)
    with applied_lora(handle, adapter), torch.no_grad():
        loss_after = float(answer_loss(handle.view, ids, mask, end, answers))
    assert loss_after < loss_before - 0.05

    neurons = [(0, 3), (0, 17), (1, 5), (1, 60)]
    change = coefficient_change(handle, adapter, ids, mask, end, neurons, answer_ids=answers)
    merged = merged_copy(handle, adapter)
    cols = (slice(None), [0, 0, 1, 1], [3, 17, 5, 60])  # [row, neuron] of [row, layer, d_mlp]
    torch.testing.assert_close(change.before, end_coefficients(handle.view, ids, mask, end, [0, 1])[cols], **TOL)
    torch.testing.assert_close(change.after, end_coefficients(merged, ids, mask, end, [0, 1])[cols], **TOL)
    assert (change.after - change.before).abs().max() > 1e-3  # the adapter moved the coefficients

    batch = SimpleNamespace(ref_ids=ids, ref_mask=mask, end=end)
    assert change.li_before is not None and change.li_after is not None
    torch.testing.assert_close(change.li_before, neuron_li(handle.view, batch, [0, 1], answers)[cols], **TOL)
    torch.testing.assert_close(change.li_after, neuron_li(merged, batch, [0, 1], answers)[cols], **TOL)
    rows = change.rows()
    assert rows[0]["neuron"] == "0_3" and rows[0]["li_change"] == pytest.approx(
        float(change.li_after[:, 0].mean() - change.li_before[:, 0].mean())
    )

    # loading the saved adapter folder gives the same coefficients as the in-memory adapter
    adapter.save(tmp_path / "adapter")
    from_disk = coefficient_change(handle, tmp_path / "adapter", ids, mask, end, neurons)
    assert torch.equal(from_disk.after, change.after) and torch.equal(from_disk.before, change.before)

    # after all of that the base model is exactly as it was, and the global RNG was not consumed
    assert_same(handle.model, before)
    assert torch.equal(plain_end_logits(handle.model, ids, mask, end), plain)
    assert torch.equal(torch.get_rng_state(), rng_before)


def test_lora_training_is_seeded_and_fresh_adapter_is_a_no_op() -> None:
    handle = handle_of("llama")
    ids, mask, end, answers = prompts(6)
    plain = plain_end_logits(handle.model, ids, mask, end)

    def train(seed: int, steps: int = 2) -> Any:
        cfg = LoraTrainConfig(layers=(1,), modules=("mlp.down_proj",), rank=2, steps=steps, seed=seed, batch_size=4)
        return train_layer_lora(handle, ids, mask, end, answers, cfg)

    a, b, c = train(0), train(0), train(1)
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state) and a.losses == b.losses
    assert any(not torch.equal(a.state[k], c.state[k]) for k in a.state)
    with applied_lora(handle, train(0, steps=0)):  # B = 0: the untrained adapter adds exactly nothing
        assert torch.equal(plain_end_logits(handle.model, ids, mask, end), plain)


def test_applied_lora_restores_on_error_and_rejects_bad_folders(tmp_path: Path) -> None:
    handle = handle_of("gpt2")
    ids, mask, end, answers = prompts(4)
    before = snapshot(handle.model)
    adapter = train_layer_lora(handle, ids, mask, end, answers, LoraTrainConfig(layers=(1,), steps=1))
    with pytest.raises(RuntimeError, match="boom"), applied_lora(handle, adapter):
        raise RuntimeError("boom")
    assert_same(handle.model, before)
    with pytest.raises(ConfigError, match="not a peft adapter folder"):
        coefficient_change(handle, tmp_path, ids, mask, end, [(0, 1)])
    adapter.save(tmp_path / "gpt2-adapter")
    check_adapter_folder(tmp_path / "gpt2-adapter")  # what the stage saves passes the --adapter check
    with pytest.raises(ConfigError, match="does not fit this model"):
        coefficient_change(handle_of("llama"), tmp_path / "gpt2-adapter", ids, mask, end, [(0, 1)])
    with pytest.raises(ConfigError, match="at least 1"):
        LoraTrainConfig(layers=(0,), rank=0)
