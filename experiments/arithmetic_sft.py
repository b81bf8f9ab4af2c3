"""Does fine-tuning only the key heads improve arithmetic? The paper's Table 1 where it can be seen.

Zhang et al. (2024, Table 1) fine-tune the key heads on math word problems; a 135M model solves almost none of those
before or after (docs/results.md, experiments/sft_table.py). Here every row trains on the skill the heads were found
for, arithmetic prompts of the operations the default model is weak at (subtraction by default), and is tested on
prompts that share neither a template family nor a fact with any training prompt of their operation
(src/arithmech/data/arithmetic_split.py). One command runs it all and writes <out>/table.md, table.csv,
comparisons.csv, sweep.csv and arithmetic_sft.png; every training and evaluation has its own folder, so a rerun
skips what is done.

Steps
    1. identify on train-part prompts of the training operations only (train templates x train pairs), so not
       even the choice of heads sees a test prompt;
    2. one learning-rate rule for every row type (precise top-k, precise random-k, full, LoRA): each candidate
       rate trains on the same data, steps and schedule with the row type's first `--sweep-seeds` training seeds
       (default 3) and is scored on the validation part (train templates x validation pairs); the rate with the
       best mean first-token accuracy over those seeds wins (ties: the smaller rate), and the row's other seeds
       train at that rate only. Top-k and random-k rows train `--seeds` seeds
       each (default 5; seed s: training seed s, and for random-k the s-th random draw of heads), so the two
       sides get the same grid, the same seeds and the same tie-break; full SFT and LoRA, the controls, train seed
       0. Each random draw is k heads touching as many key/value groups as the top-k heads (uniformly among such
       sets: finetune/matched_heads.py), so random-k trains exactly as many parameters as top-k (a K/V group
       trains once per group touched under grouped-query attention). The chosen rate's runs are the row's models;
       LoRA's rank is chosen so that its trainable parameters are closest to precise top-max(k)'s (computed from
       the model's dims and printed);
    3. every row (and base) is scored on the test part (all four operations), the multi-digit transfer set of the
       training operations, MMLU and CommonsenseQA subsets, and general-text perplexity with KL to the base
       model; trainable parameters, samples/s and peak memory come from each training's metadata.json;
    4. table.md: every accuracy with its 95% interval clustered by template and fact (evaluate/clustered_interval.py:
       Wilson with t on min(templates, facts) - 1 df), the positive control (full SFT minus base) and
       effect-ranked minus random heads at each k as paired per-prompt differences whose intervals add each
       side's seed-to-seed variance on its own df (seeds - 1) to the clustered variance, with t on the
       Welch-Satterthwaite df of the sum (stated per line, and in comparisons.csv with both sides' trainable
       parameters), and how many test problems state a fact that the training trains in another operation
       (5 - 3 = 2 trained, 2 + 3 tested).

    python experiments/arithmetic_sft.py --out runs/arithmetic-sft                   # the table (hours)
    python experiments/arithmetic_sft.py --out runs/arithmetic-sft-estimate --estimate   # time it first (minutes)
    python experiments/arithmetic_sft.py --out runs/arithmetic-sft-smoke --size smoke    # every code path, small
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


def train(a: argparse.Namespace, folder: Path, how: list[str], lr: float, seed: int = 0) -> None:
    """One training: `how` (method and heads) with the shared data, steps and schedule, and training seed `seed`."""
    if (folder / "metadata.json").is_file():
        return
    cli(["finetune", *how, "--data", "arithmetic", "--operations", ",".join(a.ops), "--split-seed", str(a.split_seed),
         "--max-samples", str(a.steps * a.batch_size), "--epochs", "1", "--batch-size", str(a.batch_size),
         "--micro-batch-size", str(a.micro_batch_size), "--lr", str(lr), "--warmup-ratio", str(a.warmup_ratio),
         "--lr-schedule", a.schedule, "--checkpoint-every", "0", "--seed", str(a.seed + seed), *model_args(a),
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


RANDOM_DRAW = "k heads touching as many key/value groups as the top-k heads, uniformly (finetune/matched_heads.py)"
"""How random-k rows draw their heads; in settings.json, so a folder trained with another draw is refused."""


def random_heads(identify_dir: Path, k: int, seed: int) -> str:
    """Seed `seed`'s draw of k heads for a random-k row: uniform among the sets of k heads that touch as many
    key/value groups as the top-k heads, so that both rows train as many heads and as many parameters (precise SFT
    trains a group's K/V rows once per group touched: finetune/matched_heads.py)."""
    from arithmech.finetune.matched_heads import kv_groups, matched_random_heads
    from arithmech.models.view import Dims
    from arithmech.stages.identify_run import by_effect, read_effects

    dims = Dims(**read_json(identify_dir / "metadata.json")["dims"])
    top = by_effect(read_effects(identify_dir, dims), "head")[:k]
    rng = random.Random(f"arithmetic-sft-{k}-{seed}")
    return ",".join(c.name for c in matched_random_heads(dims, k, len(kv_groups(top, dims.group_size)), rng))


def row_types(a: argparse.Namespace) -> dict[str, tuple[list[float], list[int]]]:
    """Row type -> (learning rates to sweep, training seeds). LoRA comes last: its rank needs precise's size."""
    types: dict[str, tuple[list[float], list[int]]] = {}
    for k in a.ks:
        types[f"precise-top{k}"] = (a.lrs_precise, list(range(a.seeds)))
        types[f"precise-random{k}"] = (a.lrs_precise, list(range(a.seeds)))
    types["full"] = (a.lrs_full, [0])
    types["lora"] = (a.lrs_lora, [0])
    return types


def finetune_args(a: argparse.Namespace, out: Path, name: str, seed: int) -> list[str]:
    """The method and trained parts of row type `name` for training seed `seed` (random heads: the seed's draw)."""
    identify_dir = out / "identify"
    if name.startswith("precise-top"):
        return ["--method", "precise", "--from", str(identify_dir), "--top-k", name.removeprefix("precise-top")]
    if name.startswith("precise-random"):
        k = int(name.removeprefix("precise-random"))
        return ["--method", "precise", "--components", random_heads(identify_dir, k, seed)]
    if name == "lora":
        precise = out / "sweep" / f"precise-top{max(a.ks)}" / f"lr-{a.lrs_precise[0]:g}" / "seed-0"
        return ["--method", "lora", "--lora-r", str(lora_rank(precise, identify_dir))]
    return ["--method", name]


def choose_lr(scores: dict[float, list[float]]) -> float:
    """The one rule for every row: the best mean validation accuracy over the seeds; ties go to the smaller lr."""
    return min(scores, key=lambda lr: (-sum(scores[lr]) / len(scores[lr]), lr))


def sweep(a: argparse.Namespace, out: Path) -> dict[str, tuple[float, list[int]]]:
    """Step 2: every (row type, lr, seed) trained and scored on validation; per row type its lr and seeds."""
    evaluate(a, out / "base", "validation", None)
    rows = [{"row": "base", "lr": 0.0, "seed": "", "validation_accuracy": sweep_score(out / "base" /
             "eval-validation", a.ops), "folder": str(out / "base")}]  # fmt: skip
    best: dict[str, tuple[float, list[int]]] = {}
    for name, (lrs, seeds) in row_types(a).items():
        scores: dict[float, list[float]] = {}
        for lr in lrs:
            for seed in seeds[: a.sweep_seeds]:
                folder = out / "sweep" / name / f"lr-{lr:g}" / f"seed-{seed}"
                train(a, folder, finetune_args(a, out, name, seed), lr, seed)
                evaluate(a, folder, "validation", folder)
                scores.setdefault(lr, []).append(sweep_score(folder / "eval-validation", a.ops))
                rows.append({"row": name, "lr": lr, "seed": seed, "validation_accuracy": scores[lr][-1],
                             "folder": str(folder)})  # fmt: skip
        chosen = choose_lr(scores)
        for seed in seeds[a.sweep_seeds :]:  # the row's other seeds train at its chosen rate only
            folder = out / "sweep" / name / f"lr-{chosen:g}" / f"seed-{seed}"
            train(a, folder, finetune_args(a, out, name, seed), chosen, seed)
        best[name] = (chosen, seeds)
    for r in rows:
        r["chosen"] = r["row"] in best and best[r["row"]][0] == r["lr"]
    lines = ["row,lr,seed,validation_accuracy,chosen,folder", *(f"{r['row']},{r['lr']:g},{r['seed']},"
             f"{r['validation_accuracy']:.6f},{r['chosen']},{r['folder']}" for r in rows)]  # fmt: skip
    (out / SWEEP_FILE).write_text("\n".join(lines) + "\n")
    return best


def final_rows(a: argparse.Namespace, out: Path) -> dict[str, Path | None]:
    """Row name -> the folder of its trained model (None: base); precise rows get one row per training seed."""
    rows: dict[str, Path | None] = {"base": None}
    for name, (lr, seeds) in sweep(a, out).items():
        for seed in seeds:
            folder = out / "sweep" / name / f"lr-{lr:g}" / f"seed-{seed}"
            rows[f"{name}-seed{seed}" if name.startswith("precise") else name] = folder
    return rows


def estimate(a: argparse.Namespace, out: Path) -> None:
    """Time 2 steps of each method and a small evaluation on this machine, and extrapolate to the full table."""
    identify_dir = identify(a, out)
    timings = read_json(identify_dir / "metadata.json").get("timings", {})
    timing: dict[str, object] = {"identify_s": sum(timings.values())}
    plan = argparse.Namespace(**{**vars(a), "steps": 2})
    for name in row_types(plan):
        if name.startswith("precise-random"):
            continue
        if name == "lora":  # its rank from the timed precise top-max(k) run (the sweep's is not trained here)
            how = ["--method", "lora", "--lora-r", str(lora_rank(out / "estimate" / f"precise-top{max(a.ks)}",
                                                                identify_dir))]  # fmt: skip
        else:
            how = finetune_args(plan, out, name, 0)
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


SIZES: dict[str, dict[str, object]] = {
    "full": {},
    "smoke": {"ks": "2", "seeds": 2, "sweep_seeds": 1, "steps": 2, "batch_size": 4, "micro_batch_size": 4,
              "lrs_precise": [1e-4, 1e-3], "lrs_full": [1e-5, 1e-4], "lrs_lora": [3e-4, 3e-3], "eval_limit": 24,
              "general_limit": 2,
              "identify_prompts": 8, "identify_pool": 32},
}
"""--size: the defaults of the table (full), or a run small enough to try every code path in minutes (smoke:
two seeds, two rates, two steps of 4 prompts; its numbers mean nothing). Options given explicitly still win."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/arithmetic-sft")
    p.add_argument("--operations", default="subtraction", help="training operations (the model's weak ones)")
    p.add_argument("--ks", default="8,32", help="precise SFT of k heads, effect-ranked and random, for each k")
    p.add_argument("--seeds", type=int, default=5, help="training seeds of every top-k and random-k row alike (each "
                   "random-k seed its own draw of heads)")
    p.add_argument("--sweep-seeds", type=int, default=3,
                   help="seeds of each row type the learning rate is chosen on (the rest train at the chosen rate)")
    p.add_argument("--steps", type=int, default=16, help="optimizer steps of every training")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per step (steps x batch = training prompts)")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--schedule", default="linear", help="linear or cosine decay after warm-up")
    p.add_argument("--lrs-precise", type=floats, default=floats("3e-4,1e-3,3e-3"), help="lr sweep, precise rows")
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
    p.add_argument("--size", choices=sorted(SIZES), default="full", help="full (the table) or smoke (code paths)")
    p.set_defaults(**SIZES[p.parse_known_args()[0].size])
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
    settings["random_heads"] = RANDOM_DRAW
    if (out / "settings.json").is_file() and read_json(out / "settings.json") != settings:
        p.error(f"{out} holds a run made with other settings (its settings.json); give another --out")
    (out / "settings.json").write_text(json.dumps(settings, indent=2))
    if a.estimate:
        estimate(a, out)
        return
    identify(a, out)
    rows = final_rows(a, out)
    for folder in rows.values():
        evaluate(a, folder or out / "base", "test", folder)
    write_outputs(out, rows, a)


if __name__ == "__main__":
    main()
