"""Issue #14: does fine-tuning only the key heads improve arithmetic? The paper's Table 1 where it can be seen.

Zhang et al. (2024, Table 1) fine-tune the key heads on math word problems; a 135M model solves almost none of
those before or after (README, experiments/sft_table.py). Here every row trains on the skill the heads were found
for, arithmetic prompts of the operations the default model is weak at (subtraction by default), and is tested
on prompts that share neither a template nor an operand pair with any training prompt
(src/arithmech/data/arithmetic_split.py). One command runs it all and writes <out>/table.md, table.csv,
sweep.csv and arithmetic_sft.png; every training and evaluation has its own folder, so a rerun skips what is done.

Steps
    1. identify on train-part prompts of the training operations only (train templates x train pairs), so not
       even the choice of heads sees a test prompt;
    2. a learning-rate sweep per row type (precise top-k, precise random-k on seed 0, full, LoRA): every
       candidate trains with the same data, steps and schedule and is scored on the validation part (train
       templates x validation pairs); the best first-token accuracy on the training operations wins (ties: the
       smaller lr). The winning run is that row's model;
    3. the other random seeds train at the random row's lr; LoRA's rank is chosen so that its trainable
       parameters are closest to precise top-max(k)'s (computed from the model's dims and printed);
    4. every row (and base) is scored on the test part (all four operations, 95% Wilson intervals), the
       multi-digit transfer set of the training operations, MMLU and CommonsenseQA subsets, and general-text
       perplexity with KL to the base model; trainable parameters, samples/s and peak memory come from each
       training's metadata.json. The table says whether full SFT, the positive control, beats base beyond the
       intervals; if not, the setup is too small (raise --steps).

    python experiments/arithmetic_sft.py --out runs/arithmetic-sft                   # about an hour, 2 CPU cores
    python experiments/arithmetic_sft.py --out runs/arithmetic-sft-estimate --estimate   # time it first (minutes)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from arithmetic_sft_table import lora_rank, print_estimate, read_json, sweep_score, write_outputs

from arithmech.data import write_prompt_file
from arithmech.data.arithmetic_split import make_split, split_prompts
from arithmech.data.templates import OPERATIONS

SWEEP_FILE = "sweep.csv"


THREADS: dict[str, str] = {}
"""OMP_NUM_THREADS for every command, when --threads is given."""


def cli(args: list[str]) -> None:
    """Run one arithmech command in a fresh process (so peak memory is its own)."""
    print("+ arithmech " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "arithmech.cli", *args, "--quiet"], check=True,
                   env={**os.environ, **THREADS})  # fmt: skip


def model_args(a: argparse.Namespace) -> list[str]:
    return [*(["--model", a.model] if a.model else []), "--device", a.device]


def identify(a: argparse.Namespace, out: Path) -> Path:
    """Step 1: the key heads, found on train-part prompts only."""
    folder = out / "identify"
    if not (folder / "metadata.json").is_file():
        prompts = split_prompts(make_split(a.split_seed), "train", a.ops, n=a.identify_pool, seed=a.seed)
        write_prompt_file(out / "identify-prompts.jsonl", prompts)
        cli(["identify", "--prompts", str(out / "identify-prompts.jsonl"), "--max-prompts", str(a.identify_prompts),
             "--fraction-threshold", "0.1", "--seed", str(a.seed), *(["--keep-incorrect"] if a.keep_incorrect else []),
             *model_args(a), "--out", str(folder)])  # fmt: skip
    return folder


def train(a: argparse.Namespace, folder: Path, how: list[str], lr: float) -> None:
    """One training: `how` (method and heads) with the shared data, steps and schedule."""
    if (folder / "metadata.json").is_file():
        return
    cli(["finetune", *how, "--data", "arithmetic", "--operations", ",".join(a.ops), "--split-seed", str(a.split_seed),
         "--max-samples", str(a.steps * a.batch_size), "--epochs", "1", "--batch-size", str(a.batch_size),
         "--micro-batch-size", str(a.micro_batch_size), "--lr", str(lr), "--warmup-ratio", str(a.warmup_ratio),
         "--lr-schedule", a.schedule, "--checkpoint-every", "0", "--seed", str(a.seed), *model_args(a),
         "--out", str(folder)])  # fmt: skip


def evaluate(a: argparse.Namespace, folder: Path, part: str, delta: Path | None) -> None:
    """validation: the training operations' validation part; test: every column of the table."""
    groups = {"validation": [("eval-validation", [f"arithmetic-{op}" for op in a.ops], a.eval_limit)],
              "test": [("eval-test", ["arithmetic", *(f"arithmetic-multidigit-{op}" for op in a.ops)], a.eval_limit),
                       ("eval-general", ["mmlu", "csqa", "general"], a.general_limit)]}[part]  # fmt: skip
    for name, benches, limit in groups:
        if (folder / name / "metadata.json").is_file():
            continue
        cli(["evaluate", *(["--delta", str(delta)] if delta else []), "--benchmarks", ",".join(benches),
             "--arithmetic-part", "validation" if part == "validation" else "test", "--split-seed", str(a.split_seed),
             *(["--limit", str(limit)] if limit else []), *(["--base-model", a.model or "default"] if name ==
             "eval-general" else []), *model_args(a), "--out", str(folder / name)])  # fmt: skip


def random_heads(identify_dir: Path, k: int, seed: int) -> str:
    """k heads drawn from all of the model's heads (as knockout's random-rank control draws them)."""
    dims = read_json(identify_dir / "metadata.json")["dims"]
    pool = [f"{layer}.{head}" for layer in range(dims["n_layers"]) for head in range(dims["n_heads"])]
    return ",".join(random.Random(f"arithmetic-sft-{k}-{seed}").sample(pool, k))


def row_types(a: argparse.Namespace, identify_dir: Path, out: Path) -> dict[str, tuple[list[str], list[float]]]:
    """Row type -> (finetune arguments, learning rates to sweep). LoRA comes last: its rank needs precise's size."""
    types: dict[str, tuple[list[str], list[float]]] = {}
    for k in a.ks:
        types[f"precise-top{k}"] = (["--method", "precise", "--from", str(identify_dir), "--top-k", str(k)],
                                    a.lrs_precise)  # fmt: skip
        types[f"precise-random{k}"] = (["--method", "precise", "--components", random_heads(identify_dir, k, 0)],
                                       a.lrs_precise)  # fmt: skip
    types["full"] = (["--method", "full"], a.lrs_full)
    types["lora"] = (["--method", "lora"], a.lrs_lora)
    return types


def sweep(a: argparse.Namespace, out: Path, types: dict[str, tuple[list[str], list[float]]]) -> dict[str, float]:
    """Step 2: every (row type, lr) trained and scored on validation; the best lr per row type."""
    evaluate(a, out / "base", "validation", None)
    rows = [{"row": "base", "lr": 0.0, "validation_accuracy": sweep_score(out / "base" / "eval-validation", a.ops),
             "folder": str(out / "base")}]  # fmt: skip
    best = {}
    for name, (how, lrs) in types.items():
        if name == "lora":
            precise = out / "sweep" / f"precise-top{max(a.ks)}" / f"lr-{a.lrs_precise[0]:g}"
            how = [*how, "--lora-r", str(lora_rank(precise, out / "identify"))]
            types[name] = (how, lrs)
        scores = {}
        for lr in lrs:
            folder = out / "sweep" / name / f"lr-{lr:g}"
            train(a, folder, how, lr)
            evaluate(a, folder, "validation", folder)
            scores[lr] = sweep_score(folder / "eval-validation", a.ops)
            rows.append({"row": name, "lr": lr, "validation_accuracy": scores[lr], "folder": str(folder)})
        best[name] = max(sorted(scores), key=lambda lr: scores[lr])  # ties: the smaller lr
    for r in rows:
        r["chosen"] = best.get(r["row"]) == r["lr"]
    lines = ["row,lr,validation_accuracy,chosen,folder", *(f"{r['row']},{r['lr']:g},{r['validation_accuracy']:.6f},"
             f"{r['chosen']},{r['folder']}" for r in rows)]  # fmt: skip
    (out / SWEEP_FILE).write_text("\n".join(lines) + "\n")
    return best


def final_rows(a: argparse.Namespace, out: Path, identify_dir: Path) -> dict[str, Path | None]:
    """Steps 2-3: row name -> the folder of its trained model (None: base)."""
    types = row_types(a, identify_dir, out)
    best = sweep(a, out, types)
    rows: dict[str, Path | None] = {"base": None}
    for name in types:
        chosen = out / "sweep" / name / f"lr-{best[name]:g}"
        if not name.startswith("precise-random"):
            rows[name] = chosen
            continue
        k = int(name.removeprefix("precise-random"))
        rows[f"{name}-seed0"] = chosen
        for seed in range(1, a.random_seeds):
            folder = out / "random" / f"{name}-seed{seed}-lr-{best[name]:g}"
            train(a, folder, ["--method", "precise", "--components", random_heads(identify_dir, k, seed)], best[name])
            rows[f"{name}-seed{seed}"] = folder
    return rows


def estimate(a: argparse.Namespace, out: Path) -> None:
    """Time 2 steps of each method and a small evaluation on this machine, and extrapolate to the full table."""
    identify_dir = identify(a, out)
    timings = read_json(identify_dir / "metadata.json").get("timings", {})
    timing: dict[str, object] = {"identify_s": sum(timings.values())}
    plan = argparse.Namespace(**{**vars(a), "steps": 2})
    for name, (how, _) in row_types(plan, identify_dir, out).items():
        if name.startswith("precise-random"):
            continue
        if name == "lora":
            how = [*how, "--lora-r", str(lora_rank(out / "estimate" / f"precise-top{max(a.ks)}", identify_dir))]
        folder = out / "estimate" / name
        start = time.perf_counter()
        train(plan, folder, how, 1e-4)
        log = list(csv.DictReader((folder / "train_log.csv").open()))
        timing[name] = {"s_per_step": float(log[-1]["seconds"]), "call_s": time.perf_counter() - start}
    small = argparse.Namespace(**{**vars(a), "eval_limit": 48, "general_limit": 4})
    start = time.perf_counter()
    evaluate(small, out / "estimate" / "base", "test", None)
    timing["eval_call_s"] = time.perf_counter() - start
    (out / "estimate.json").write_text(json.dumps(timing, indent=2))
    print_estimate(out, a, timing)


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/arithmetic-sft")
    p.add_argument("--operations", default="subtraction", help="training operations (the model's weak ones)")
    p.add_argument("--ks", default="8,32", help="precise SFT of k heads, effect-ranked and random, for each k")
    p.add_argument("--random-seeds", type=int, default=3, help="seeds of the random-heads rows")
    p.add_argument("--steps", type=int, default=16, help="optimizer steps of every training")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per step (steps x batch = training prompts)")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--schedule", default="linear", help="linear or cosine decay after warm-up")
    p.add_argument("--lrs-precise", type=floats, default=floats("1e-4,3e-4,1e-3"), help="lr sweep, precise rows")
    p.add_argument("--lrs-full", type=floats, default=floats("1e-5,3e-5,1e-4"), help="lr sweep, full SFT")
    p.add_argument("--lrs-lora", type=floats, default=floats("3e-4,1e-3,3e-3"), help="lr sweep, LoRA")
    p.add_argument("--eval-limit", type=int, default=None, help="arithmetic prompts per benchmark (default all)")
    p.add_argument("--general-limit", type=int, default=20, help="MMLU, CommonsenseQA rows and general texts")
    p.add_argument("--identify-prompts", type=int, default=64, help="prompts identify patches")
    p.add_argument("--identify-pool", type=int, default=256, help="train-part prompts identify picks them from")
    p.add_argument("--keep-incorrect", action="store_true", help="identify on every prompt (for a tiny test model)")
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="default: the built-in SmolLM2-135M-Instruct")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads per command (default: torch's own)")
    p.add_argument("--estimate", action="store_true", help="time a few steps and evaluations, print the estimate")
    a = p.parse_args()
    a.ops = tuple(x.strip() for x in a.operations.split(",") if x.strip())
    a.ks = [int(k) for k in a.ks.split(",")]
    if not a.ops or any(op not in OPERATIONS for op in a.ops):
        p.error(f"--operations takes {', '.join(OPERATIONS)}")
    if a.threads:
        THREADS["OMP_NUM_THREADS"] = str(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = json.loads(json.dumps({k: v for k, v in vars(a).items() if k not in ("estimate", "threads", "out")}))
    if (out / "settings.json").is_file() and read_json(out / "settings.json") != settings:
        p.error(f"{out} holds a run made with other settings (its settings.json); give another --out")
    (out / "settings.json").write_text(json.dumps(settings, indent=2))
    if a.estimate:
        estimate(a, out)
        return
    rows = final_rows(a, out, identify(a, out))
    for folder in rows.values():
        evaluate(a, folder or out / "base", "test", folder)
    write_outputs(out, rows, a)


if __name__ == "__main__":
    main()
