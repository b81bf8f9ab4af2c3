"""Precise SFT (top-k heads) vs full SFT on the default model: training samples/second and peak memory.

Both methods run the same finetune stage on the same data (LLM-Adapters math train split, answer targets by
default so sequences stay short on a CPU), schedule and batch; the first optimizer step is a warm-up and is not
timed. Each method runs in its own process, so that peak memory (CUDA max_memory_allocated, or the process's peak
resident set size on a CPU, which includes the loaded model) is its own. Prints both and the ratios (paper, on
LLaMA2-7B with 8 A100s: precise SFT about 3.3x the samples/second of full SFT).

    python benchmarks/finetune.py [--steps 3] [--batch-size 4] [--from RUN_DIR --top-k 10] [--device cuda]

Without --from, the heads are the top 10 of the `make demo` identify run (docs/results.md) on SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from record import record

DEMO_TOP_HEADS = "14.2,18.5,13.6,20.8,21.7,20.1,18.3,19.4,23.0,20.2"


def run_one(args: argparse.Namespace) -> dict[str, object]:
    """Train with one method in this process and return its measurements."""
    import torch

    from arithmech.models.load import ModelConfig, load_model
    from arithmech.stages.finetune import finetune
    from arithmech.stages.finetune_config import FinetuneConfig

    torch.set_num_threads(args.threads)
    handle = load_model(ModelConfig(model=args.model, device=args.device))
    selection = {"from_run": args.from_run, "top_k": args.top_k} if args.from_run else {
        "components": tuple(DEMO_TOP_HEADS.split(","))[: args.top_k]
    }
    cfg = FinetuneConfig(
        method=args.only, **selection, target=args.target, max_samples=args.max_samples, max_length=args.max_length,
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, max_steps=args.steps + 1,
        checkpoint_every=0,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        result = finetune(handle, cfg, out, quiet=True)
    timed = result.train.log[1:]
    seconds = sum(row["seconds"] for row in timed)
    return {
        "method": args.only,
        "samples_per_second": len(timed) * args.batch_size / seconds,
        "seconds_per_step": seconds / len(timed),
        "tokens_per_step": sum(row["tokens"] for row in timed) / len(timed),
        "trainable_parameters": result.metadata["trainable_parameters"],
        "total_parameters": result.metadata["total_parameters"],
        "peak_memory": result.metadata["peak_memory"],
        "heads": result.selection.get("heads"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after one warm-up step)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=10, help="heads trained by precise SFT")
    parser.add_argument("--from", dest="from_run", default=None, help="identify run folder (its top-k heads)")
    parser.add_argument("--target", default="answer", help="answer or rationale")
    parser.add_argument("--max-samples", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--only", choices=["precise", "full"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_one(args)))
        return

    results = {}
    for method in ("precise", "full"):
        cmd = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--only", method]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{method} failed:\n{done.stderr[-3000:]}")
        results[method] = json.loads(done.stdout.strip().splitlines()[-1])
    precise, full = results["precise"], results["full"]
    for r in (precise, full):
        mib = r["peak_memory"]["bytes"] / 2**20
        print(
            f"{r['method']:>8}: {r['samples_per_second']:.2f} samples/s ({r['seconds_per_step']:.2f} s/step, "
            f"{r['tokens_per_step']:.0f} target tokens/step), trainable {r['trainable_parameters']:,} of "
            f"{r['total_parameters']:,}, peak memory {mib:.0f} MiB ({r['peak_memory']['kind']})"
        )
    print(f"heads: {','.join(precise['heads'] or [])}")
    speedup = precise["samples_per_second"] / full["samples_per_second"]
    print(f"speedup precise / full: {speedup:.2f}x (paper: 3.3x)")
    ratio = full["peak_memory"]["bytes"] / precise["peak_memory"]["bytes"]
    print(f"peak memory full / precise: {ratio:.2f}x")
    record("finetune", args, {
        "speedup": speedup, "memory_ratio": ratio,
        "precise_samples_per_s": precise["samples_per_second"], "full_samples_per_s": full["samples_per_second"],
    })  # fmt: skip


if __name__ == "__main__":
    main()
