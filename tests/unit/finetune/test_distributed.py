"""Two CPU processes (over gloo, as `accelerate launch --num_processes 2 --cpu` starts them) train the same
parameters to the same values as one process with the same global batch: with DDP, and with FSDP2.

Each process gets the environment accelerate's launcher would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) and runs the finetune stage for each method; each takes half of every global batch, in two
micro-batches, while the single process takes the whole batch in one. accelerate turns FSDP on only for GPU
processes, so the FSDP2 workers force it on their CPU accelerator: the sharding, gathering and checkpoint code is
the same as on GPUs.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from arithmech.errors import ConfigError
from arithmech.finetune.train import TrainConfig, train
from arithmech.models.load import ModelConfig, ModelHandle, load_model
from arithmech.stages.finetune import finetune
from arithmech.stages.finetune_config import FinetuneConfig

WORKER = """
import json, sys, torch
torch.set_num_threads(1)
import arithmech.stages.finetune as stage
from arithmech.models.load import ModelConfig, load_model
from arithmech.stages.finetune import finetune
from arithmech.stages.finetune_config import FinetuneConfig

def fsdp2_on_cpu(device):
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    prepare = accelerator.prepare

    def prepare_and_check(*objects):
        prepared = prepare(*objects)
        assert all(type(p).__name__ == "DTensor" for p in prepared[0].parameters()), "not sharded"
        return prepared

    accelerator.prepare = prepare_and_check
    return accelerator

if sys.argv[3] == "FSDP":
    stage.accelerator_for = fsdp2_on_cpu
for settings, out in json.loads(sys.argv[2]):
    handle = load_model(ModelConfig(model=sys.argv[1], dtype=settings.pop("dtype", "float32")))
    result = finetune(handle, FinetuneConfig(**settings), out, quiet=True)
    assert result.train.world_size == 2, result.train.world_size
"""


FLOAT32 = (1e-6, 1e-6)
"""Largest |difference| of trained values and relative difference of losses, one vs two processes."""
BFLOAT16 = (1e-2, 1e-3)
"""The same with bfloat16 forward passes: two processes sum in another order, each sum rounded to 8 bits."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settings_for(method: str, data: Path) -> dict[str, Any]:
    return {
        "method": method,
        "components": ["0.1", "1.2", "2.0"],
        "mlps": ["1"],
        "data": str(data),
        "target": "answer",
        "batch_size": 8,
        "micro_batch_size": 2,  # per process: 2 micro-batches of 2 examples in each of the 2 processes
        "max_steps": 3,
        "lr": 1e-4,  # small: Adam scales near-zero gradients up, so their rounding differences grow with lr
        "head_scale": "learning-rate",  # precise: per-layer optimizer groups of their own lr, sharded and resumed
        "warmup_ratio": 0.0,
        "lora_dropout": 0.0,  # dropout masks depend on the process, so runs on 1 and 2 processes would differ
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "methods"), [("MULTI_CPU", ("precise", "full")), ("FSDP", ("precise", "full", "lora"))]
)
def test_two_processes_train_like_one(
    engine: str, methods: tuple[str, ...], tiny_model_dir, handle_of, sft_jsonl, tmp_path: Path
) -> None:
    jobs = [(settings_for(m, sft_jsonl), str(tmp_path / "two" / m)) for m in methods]
    if engine == "FSDP":  # a run stopped after 2 steps, then resumed from its (gathered) checkpoint; bfloat16
        precise, resumed = settings_for("precise", sft_jsonl), str(tmp_path / "two" / "precise-resumed")
        jobs += [({**precise, "stop_after": 2}, resumed), ({**precise, "resume": True}, resumed),
                 ({**precise, "dtype": "bfloat16"}, str(tmp_path / "two" / "bf16"))]  # fmt: skip
    procs = _launch_two(tiny_model_dir("llama"), jobs, engine)
    for method in methods:  # the single-process runs, while the two processes work
        settings = {**settings_for(method, sft_jsonl), "micro_batch_size": 8}
        finetune(handle_of("llama"), FinetuneConfig(**settings), tmp_path / "one" / method, quiet=True)
    if engine == "FSDP":
        settings = {**settings_for("precise", sft_jsonl), "micro_batch_size": 8}
        bf16 = load_model(ModelConfig(model=str(tiny_model_dir("llama")), dtype="bfloat16"))
        finetune(bf16, FinetuneConfig(**settings), tmp_path / "one" / "bf16", quiet=True)
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs[0][-3000:] + outputs[1][-3000:]

    pairs = [(tmp_path / "one" / m, tmp_path / "two" / m, FLOAT32) for m in methods]
    if engine == "FSDP":
        pairs.append((tmp_path / "one" / "precise", tmp_path / "two" / "precise-resumed", FLOAT32))
        pairs.append((tmp_path / "one" / "bf16", tmp_path / "two" / "bf16", BFLOAT16))
    for one, two, (atol, loss_rel) in pairs:
        meta = json.loads((two / "metadata.json").read_text())
        assert meta["distributed"] == {"type": engine, "processes": 2}
        a, b = load_file(one / "delta.safetensors"), load_file(two / "delta.safetensors")
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol)
        base = _base_entries(handle_of("llama"), one)
        assert any(not torch.equal(a[k], base[k]) for k in a)  # training moved something
        assert _losses(one) == pytest.approx(_losses(two), rel=loss_rel)


def _launch_two(model_dir: Path, jobs: list[Any], engine: str) -> list[subprocess.Popen[str]]:
    """Start the two worker processes of one run, as `accelerate launch --num_processes 2` would."""
    port, procs = str(free_port()), []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
        }  # fmt: skip
        cmd = [sys.executable, "-c", WORKER, str(model_dir), json.dumps(jobs), engine]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _losses(folder: Path) -> list[float]:
    return [float(row["loss"]) for row in csv.DictReader((folder / "train_log.csv").open())]


def _base_entries(handle: ModelHandle, folder: Path) -> dict[str, torch.Tensor]:
    """The base model's values of every delta entry."""
    manifest = json.loads((folder / "delta.json").read_text())
    out = {}
    for entry in manifest["entries"]:
        param = handle.model.get_parameter(entry["parameter"]).detach()
        if entry["ranges"] is None:
            out[entry["tensor"]] = param
        else:
            index = torch.tensor([i for start, stop in entry["ranges"] for i in range(start, stop)])
            out[entry["tensor"]] = param.index_select(entry["dim"], index)
    return out


@pytest.mark.parametrize(("kind", "named"), [("DEEPSPEED", "DeepSpeed"), ("FSDP", "FSDP version 1")])
def test_deepspeed_and_fsdp1_are_refused_in_one_sentence(kind: str, named: str, tmp_path: Path) -> None:
    accelerator = SimpleNamespace(num_processes=1, distributed_type=f"DistributedType.{kind}", is_fsdp2=False)
    with pytest.raises(ConfigError, match=f"not {named}.*fsdp_version: 2"):
        train(accelerator, None, [], 0, TrainConfig(batch_size=8, micro_batch_size=8), tmp_path, {})  # type: ignore[arg-type]
