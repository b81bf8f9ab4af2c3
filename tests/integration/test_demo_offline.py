"""`make demo`'s config runs on a fresh clone: no ../shared beside it, no network (issue #11, section 1).

`arithmech run --config configs/default-model.yaml` runs in a subprocess on the tiny llama with every stage of
the config shrunk by --set, from a temporary working folder, with the HF offline variables set and no
$ARITHMECH_DATA. `offline_guard` refuses every open() under the shared folder and every internet connection, so
a lookup that still reached ../shared or the hub fails the run; the data must come from the copy shipped in the
package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import arithmech

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SHARED = ROOT.parent / "shared"
CONFIG = ROOT / "configs" / "default-model.yaml"
OUT = "runs/demo"  # the config's own out, relative to the working folder

SMALL: dict[str, Any] = {  # every stage on a few prompts; transfer keeps its default targets (svamp, gsm8k too)
    "identify": {"filter_correct": False, "max_prompts": 8, "n_per_template": 2, "formations": ["equation"]},
    "knockout": {"max_k": 2, "n_random": 1, "max_prompts": 4},
    "transfer": {"n_random": 1, "max_prompts": 4, "limit": 3, "n_per_template": 2, "filter_correct": False},
    "attention": {"max_prompts": 4},
    "mlp": {"max_prompts": 4},
    "mediation": {"tasks": ["addition"], "formats": ["equation"], "neuron_k": 3},
    "agreement": {"max_prompts": 4, "methods": ["path", "attribution"]},
    "neurons": {"max_prompts": 2, "filter_correct": False, "importance_layers": [1, 2], "keep_sizes": [0, 8],
                "n_random": 1, "lora_steps": 1, "lora_rank": 2, "top_neurons": 4, "top_heads": 2, "few_shot": 1},
    "fourier": {"max_prompts": 4, "cutoffs": [1, 3]},
    "heuristics": {"operations": ["addition", "division"], "filter_correct": False, "few_shot": 1, "max_pairs": 12,
                   "layers": [1], "ks": [1, 2], "n_random": 2, "top_neurons": 2, "batch_size": 8},
    "circuit": {"keep_incorrect": True, "n_prompts": 2, "percents": [1, 10, 100], "batch_size": 2, "steps": 2},
    "finetune": {"top_k": 2, "max_samples": 8, "batch_size": 2, "micro_batch_size": 2, "max_steps": 1,
                 "max_length": 512},
    "evaluate": {"limit": 2, "n_shot": 0, "general_max_tokens": 32},
}  # fmt: skip


def overrides(stages: list[str]) -> list[str]:
    """--set arguments: the stage list and each small setting (JSON is YAML, as --set reads it)."""
    args = ["--set", f"stages={json.dumps(stages)}"]
    for stage, settings in SMALL.items():
        args += [a for key, value in settings.items() for a in ("--set", f"{stage}.{key}={json.dumps(value)}")]
    return args


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ARITHMECH_DATA"}
    src = str(Path(arithmech.__file__).resolve().parents[1])  # the arithmech under test
    env.update(PYTHONPATH=os.pathsep.join([src, str(TESTS)]), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")  # fmt: skip
    return env


def test_default_config_runs_every_stage_offline_without_shared(
    tiny_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    stages = yaml.safe_load(CONFIG.read_text())["stages"]
    assert set(SMALL) == set(stages) and {"finetune", "evaluate"} <= set(stages)
    cmd = [sys.executable, str(TESTS / "offline_guard.py"), str(SHARED), "run", "--config", str(CONFIG),
           "--model", str(tiny_model_dir("llama")), "--quiet", *overrides(stages)]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=offline_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / OUT
    for stage in stages:
        assert (run / stage / "metadata.json").is_file(), stage
    transfer = json.loads((run / "transfer" / "metadata.json").read_text())["targets"]
    assert {"svamp", "gsm8k"} <= set(transfer)  # the targets that stopped the demo
    for name in ("svamp", "gsm8k"):  # transfer.limit rows each, all too long for the tiny model's 128 positions
        assert transfer[name]["note"] == "3 prompts longer than the context dropped"
    evaluated = json.loads((run / "evaluate" / "base" / "metadata.json").read_text())["benchmarks"]
    trained = json.loads((run / "finetune" / "metadata.json").read_text())["data"]
    assert trained["path"] == "arithmetic" and trained["operations"] == ["subtraction"]
    arithmetic = evaluated["arithmetic-subtraction"]["info"]  # built from the templates shipped in the package
    assert arithmetic["split_fingerprint"] == trained["split_fingerprint"] and arithmetic["part"] == "test"
    assert evaluated["general"]["info"]["text"] == "built-in general_text.jsonl"
    assert (run / "evaluate" / "tuned" / "arithmetic.csv").is_file()
