"""The finetune stage end to end on tiny saved models: what changes, the delta, resume, LoRA, config errors.

Which entries precise SFT may change is written out by hand per layout here (not taken from ModelView), so a
wrong slice in the view would fail these tests.
"""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from arithmech.errors import ConfigError, DataError
from arithmech.finetune.data import tokenize_examples
from arithmech.finetune.delta import apply_delta
from arithmech.finetune.methods import make_trainable
from arithmech.finetune.sft_rows import read_sft_examples
from arithmech.finetune.train import accelerator_for, train
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.models.sites import Component
from arithmech.stages.finetune import finetune, select_components
from arithmech.stages.finetune_config import FinetuneConfig

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # peft -> transformers
FAST = {"batch_size": 8, "micro_batch_size": 4, "lr": 1e-2, "warmup_ratio": 0.0, "target": "answer"}


def config(data: Path, **overrides: Any) -> FinetuneConfig:
    return FinetuneConfig(**{"data": str(data), "max_steps": 3, **FAST, **overrides})


def snapshot(handle: ModelHandle) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in handle.model.named_parameters()}


def allowed_entries(arch: str, handle: ModelHandle, heads: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Boolean masks of the entries precise SFT may change, written out per layout."""
    params = dict(handle.model.named_parameters())
    masks = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in params.items()}
    d = handle.dims
    dh, group = d.d_head, d.n_heads // d.n_kv_heads
    for layer, head in heads:
        q, kv = slice(head * dh, (head + 1) * dh), slice(head // group * dh, (head // group + 1) * dh)
        if arch in ("llama", "qwen2"):
            pre = f"model.layers.{layer}.self_attn"
            for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                masks[f"{pre}.{proj}.weight"][rows, :] = True
                if arch == "qwen2":
                    masks[f"{pre}.{proj}.bias"][rows] = True
            masks[f"{pre}.o_proj.weight"][:, q] = True
        elif arch == "gpt2":  # Conv1D (in, out); c_attn output = [Q | K | V]
            pre, width = f"transformer.h.{layer}.attn", d.n_heads * dh
            for block in range(3):
                cols = slice(block * width + head * dh, block * width + (head + 1) * dh)
                masks[f"{pre}.c_attn.weight"][:, cols] = True
                masks[f"{pre}.c_attn.bias"][cols] = True
            masks[f"{pre}.c_proj.weight"][q, :] = True
        elif arch == "gpt-neox":  # query_key_value output per head: [q_h | k_h | v_h]
            pre = f"gpt_neox.layers.{layer}.attention"
            rows = slice(head * 3 * dh, (head + 1) * 3 * dh)
            masks[f"{pre}.query_key_value.weight"][rows, :] = True
            masks[f"{pre}.query_key_value.bias"][rows] = True
            masks[f"{pre}.dense.weight"][:, q] = True
    return masks


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gpt-neox"])
def test_precise_changes_the_selected_slices_and_nothing_else(arch: str, handle_of, sft_jsonl, tmp_path) -> None:
    handle = handle_of(arch)
    before = snapshot(handle)
    heads = [(0, 1), (1, 2), (1, 3)]
    cfg = config(sft_jsonl, components=tuple(f"{layer}.{head}" for layer, head in heads), mlps=("1",))
    result = finetune(handle, cfg, tmp_path / "out", quiet=True)
    masks = allowed_entries(arch, handle, heads)
    mlp_prefix = handle.view.spec.layers + ".1." + handle.view.spec.mlp + "."
    for name, p in handle.model.named_parameters():
        if name.startswith(mlp_prefix):
            masks[name][...] = True
        changed = p.detach() != before[name]
        assert not changed[~masks[name]].any(), f"{name} changed outside the selection"
        assert changed[masks[name]].all(), f"{name}: some selected entries did not train"
    assert not any(p.requires_grad is False for p in handle.model.parameters())  # flags restored
    assert result.metadata["trainable_parameters"] == sum(int(m.sum()) for m in masks.values())


@pytest.mark.parametrize("method", ["precise", "full", "lora"])
def test_delta_applied_to_the_base_model_reproduces_the_trained_logits(method: str, handle_of, sft_jsonl, tmp_path):
    trained = handle_of("qwen2")
    out = tmp_path / method
    cfg = config(sft_jsonl, method=method, components=("0.0", "1.3"), save_merged=method == "precise")
    result = finetune(trained, cfg, out, quiet=True)
    manifest = json.loads((out / "delta.json").read_text())
    assert manifest["method"] == method and manifest["entries"]
    base = handle_of("qwen2")
    ids = torch.randint(3, 250, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(base.model(input_ids=ids).logits, trained.model(input_ids=ids).logits)
        apply_delta(base.model, out)
        assert torch.equal(base.model(input_ids=ids).logits, trained.model(input_ids=ids).logits)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["trainable_parameters"] < meta["total_parameters"] or method == "full"
    assert meta["samples_per_second"] > 0 and meta["peak_memory"]["bytes"] > 0
    assert len(list(csv.DictReader((out / "train_log.csv").open()))) == result.train.steps == 3
    assert not (out / "checkpoints").exists()
    with pytest.raises(DataError, match="apply the delta to the model it was trained on"):
        apply_delta(handle_of("llama").model, out)
    if method == "precise":  # the merged export is the trained model too
        merged = load_model(ModelConfig(model=str(out / "merged")))
        assert merged.tokenizer.pad_token_id == trained.tokenizer.pad_token_id
        with torch.no_grad():
            assert torch.equal(merged.model(input_ids=ids).logits, trained.model(input_ids=ids).logits)


@pytest.mark.parametrize(  # lora has dropout: the RNG must be restored too; learning-rate: per-layer group lrs
    ("method", "head_scale"), [("precise", "gradient"), ("precise", "learning-rate"), ("lora", "gradient")]
)
def test_resume_after_a_crash_gives_the_same_weights(method: str, head_scale: str, handle_of, sft_jsonl, tmp_path):
    overrides = {"method": method, "components": ("0.1", "1.2", "1.3"), "mlps": ("0",), "max_steps": 4,
                 "lora_dropout": 0.3, "head_scale": head_scale}  # fmt: skip
    finetune(handle_of("llama"), config(sft_jsonl, **overrides), tmp_path / "straight", quiet=True)
    part = finetune(handle_of("llama"), config(sft_jsonl, stop_after=2, **overrides), tmp_path / "split", quiet=True)
    assert not part.train.finished and part.train.steps == 2
    assert not (tmp_path / "split" / "metadata.json").exists()
    assert (tmp_path / "split" / "checkpoints" / "step-00000002" / "state.json").is_file()
    rest = finetune(handle_of("llama"), config(sft_jsonl, resume=True, **overrides), tmp_path / "split", quiet=True)
    assert rest.train.finished and rest.train.resumed_from == 2
    a, b = load_file(tmp_path / "straight" / "delta.safetensors"), load_file(tmp_path / "split" / "delta.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [r["loss"] for r in csv.DictReader((tmp_path / "straight" / "train_log.csv").open())]
    assert losses == [r["loss"] for r in csv.DictReader((tmp_path / "split" / "train_log.csv").open())]


def test_head_scale_is_recorded_and_the_log_shows_the_base_lr(handle_of, sft_jsonl, tmp_path) -> None:
    """The learning-rate form: per-layer H / h_l in the metadata; train_log.csv's lr is the schedule's base lr
    (the head groups run at it times H / h_l), warm-up over 2 of 4 steps, then linear decay."""
    cfg = config(sft_jsonl, components=("0.1", "1.2", "1.3"), head_scale="learning-rate", max_steps=4, warmup_ratio=0.5)
    finetune(handle_of("llama"), cfg, tmp_path, quiet=True)
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta["config"]["head_scale"] == "learning-rate"
    assert meta["selection"]["head_scale"] == "learning-rate"
    assert meta["selection"]["layer_scale"] == {"0": 4.0, "1": 2.0}  # 4 heads; 1 and 2 selected
    lrs = [float(row["lr"]) for row in csv.DictReader((tmp_path / "train_log.csv").open())]
    assert lrs == pytest.approx([0.0, 0.5 * FAST["lr"], FAST["lr"], 0.5 * FAST["lr"]])


def test_resume_refuses_other_settings_or_a_missing_checkpoint(handle_of, sft_jsonl, tmp_path) -> None:
    cfg = config(sft_jsonl, components=("0.1",), max_steps=4)
    finetune(handle_of("llama"), FinetuneConfig(**{**cfg.__dict__, "stop_after": 1}), tmp_path, quiet=True)
    with pytest.raises(ConfigError, match="other settings"):
        finetune(handle_of("llama"), FinetuneConfig(**{**cfg.__dict__, "lr": 0.5, "resume": True}), tmp_path, True)
    with pytest.raises(ConfigError, match="no checkpoint"):
        finetune(handle_of("llama"), FinetuneConfig(**{**cfg.__dict__, "resume": True}), tmp_path / "new", True)


def test_the_micro_batch_size_does_not_change_the_result(handle_of, sft_jsonl, tmp_path) -> None:
    """Gradient accumulation gives the gradient of the global batch's mean token loss, however it is cut.

    (Qwen2, not GPT-2: a GPT-2 key bias has zero gradient in exact arithmetic, so Adam amplifies rounding noise
    there into updates that depend on the cut; they change no output, since softmax ignores the shift.)
    """
    for micro in (1, 8):
        cfg = config(sft_jsonl, components=("0.1", "1.2"), micro_batch_size=micro, lr=1e-4)
        finetune(handle_of("qwen2"), cfg, tmp_path / str(micro), quiet=True)
    a, b = load_file(tmp_path / "1" / "delta.safetensors"), load_file(tmp_path / "8" / "delta.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)


def test_lora_trains_only_adapter_parameters(handle_of, sft_jsonl, tmp_path) -> None:
    handle = handle_of("llama")
    before = snapshot(handle)
    trainable = make_trainable("lora", handle.view, lora={"r": 2, "alpha": 4, "dropout": 0.0})
    named = trainable.trainable_named()
    assert named and all("lora_" in name for name, _ in named)
    d = handle.dims
    n_kv = d.n_kv_heads * d.d_head
    r, n_q = 2, d.n_heads * d.d_head
    per_layer = r * (d.d_model + n_q) + 2 * r * (d.d_model + n_kv) + r * (n_q + d.d_model)  # q, k and v, o
    assert sum(p.numel() for _, p in named) == d.n_layers * per_layer
    lora_before = {name: p.detach().clone() for name, p in named}
    examples, _ = read_sft_examples(sft_jsonl, "answer")
    data, _ = tokenize_examples(handle.tokenizer, examples, 128)
    cfg = FinetuneConfig(components=("0.0",), max_steps=2, **FAST)
    train(accelerator_for(handle.device), trainable, data, 256, cfg, tmp_path, {}, quiet=True)
    base = {
        n.replace("base_model.model.", "").replace(".base_layer", ""): p
        for n, p in trainable.module.named_parameters()
    }
    assert all(torch.equal(base[name], value) for name, value in before.items())
    assert any(not torch.equal(p, lora_before[name]) for name, p in named)


def test_selection_from_an_identify_run(handle_of, fake_identify_run) -> None:
    handle = handle_of("llama")
    effects = {"1.2": -0.3, "0.1": -0.2, "mlp.2": -0.5, "2.0": 0.1, "mlp.0": -0.05}
    run = fake_identify_run(handle, effects)
    heads, mlps = select_components(handle, FinetuneConfig(from_run=str(run), top_k=2, top_mlps=1))
    assert heads == [Component(1, 2), Component(0, 1)] and mlps == [2]
    with pytest.raises(ConfigError, match="larger than the 12 heads"):
        select_components(handle, FinetuneConfig(from_run=str(run), top_k=13))
    with pytest.raises(ConfigError, match="does not exist"):
        select_components(handle, FinetuneConfig(from_run=str(run.parent / "missing")))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"method": "adapter", "components": ("1.0",)}, "method 'adapter' is not one of"),
        ({}, "precise SFT needs heads"),
        ({"components": ("1.0",), "target": "cot"}, "target 'cot'"),
        ({"components": ("1.0",), "batch_size": 10, "micro_batch_size": 4}, "not a multiple of micro_batch_size"),
        ({"method": "full", "top_mlps": 2}, "top_mlps ranks MLPs by an identify run"),
        ({"components": ("1.0",), "lr_schedule": "step"}, "lr_schedule 'step'"),
        ({"components": ("1.0",), "head_scale": "lr"}, "head_scale 'lr' is not one of gradient, learning-rate, none"),
    ],
)
def test_config_errors_are_one_clear_sentence(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FinetuneConfig(**overrides)


def test_components_must_exist_in_the_model(handle_of, sft_jsonl, tmp_path) -> None:
    with pytest.raises(ConfigError, match="each layer has heads 0..3"):
        finetune(handle_of("llama"), config(sft_jsonl, components=("1.7",)), tmp_path, quiet=True)
    with pytest.raises(ConfigError, match="layers 0..2"):
        finetune(handle_of("llama"), config(sft_jsonl, components=("0.1",), mlps=("9",)), tmp_path, quiet=True)


def test_no_nan_reaches_the_train_log(handle_of, sft_jsonl, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without clipping there is no gradient norm: an empty cell. A loss that is NaN is refused at its step."""
    train_module = importlib.import_module("arithmech.finetune.train")  # the package exports a function of that name
    handle = handle_of("llama")
    out = tmp_path / "unclipped"
    finetune(handle, config(sft_jsonl, components=("0.1",), max_grad_norm=0.0), out, quiet=True)
    rows = list(csv.DictReader((out / "train_log.csv").open()))
    assert len(rows) == 3 and all(r["grad_norm"] == "" and float(r["loss"]) > 0 for r in rows)
    real = train_module.token_loss_sum
    monkeypatch.setattr(train_module, "token_loss_sum", lambda logits, labels: real(logits, labels) * float("nan"))
    with pytest.raises(ConfigError, match=r"training diverged at step 1 of 3: the loss is nan; lower the learning"):
        finetune(handle, config(sft_jsonl, components=("0.1",)), tmp_path / "diverged", quiet=True)
    assert not (tmp_path / "diverged" / "metadata.json").exists()


def test_examples_longer_than_the_context_are_dropped(handle_of, sft_jsonl, tmp_path) -> None:
    """GPT-2's learned positions end at its context (128 in the tiny model): max_length 512 must not reach them."""
    handle = handle_of("gpt2")
    rows = [json.loads(line) for line in sft_jsonl.read_text().splitlines()][:9]
    rows[0]["question"] = "Count the apples in this very long story. " * 4  # ~190 byte tokens with the answer
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = finetune(handle, config(data, method="full", max_steps=1, max_length=512), tmp_path / "out", quiet=True)
    assert result.train.finished
    assert result.metadata["data"]["max_length"] == 128 and result.metadata["data"]["too_long"] == 1
