"""Precise SFT (32 heads) vs full SFT steps on a random-init LLaMA2-7B-shaped model in bfloat16, on one GPU.

The paper's setting (Zhang et al. 2024, sec. 5.3: top-32 heads of LLaMA2-7B, 3.3x the samples/second of full
SFT) at the scale of one optimizer step: each method runs in its own process (so CUDA peak memory is its own)
on the same random token sequences through the same training loop (`arithmech.finetune.train`); the first step
is a warm-up and is not timed. Full SFT of 6.7B parameters with AdamW needs about 110 GB (bf16 weights and
gradients, fp32 moments): an H100/H200-class GPU, or --layers 16 for half the model. Prints seconds per step,
samples/second and peak memory of each method and their ratios.

    python benchmarks/gpu_finetune.py [--steps 3] [--batch-size 8] [--tokens 256] [--heads 32] [--layers 32]
    python benchmarks/gpu_finetune.py --device cpu --layers 2 --hidden 256   # a smoke test of the script
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import record


def run_one(args: argparse.Namespace) -> dict[str, object]:
    """Train with one method in this process and return its measurements."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from arithmech.finetune.data import TokenizedExample
    from arithmech.finetune.methods import make_trainable
    from arithmech.finetune.train import TrainConfig, accelerator_for, train
    from arithmech.models.archs import spec_for_model_type
    from arithmech.models.sites import Component
    from arithmech.models.view import ModelView

    device = torch.device(args.device)
    heads_per_layer = args.hidden // 128
    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.hidden * 11008 // 4096, num_hidden_layers=args.layers,
        num_attention_heads=heads_per_layer, num_key_value_heads=heads_per_layer, vocab_size=32000,
        max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    start = time.perf_counter()
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    built_s = time.perf_counter() - start
    view = ModelView(model, spec_for_model_type("llama"))
    gen = torch.Generator().manual_seed(1)
    chosen = torch.randperm(args.layers * heads_per_layer, generator=gen)[: args.heads].tolist()
    heads = [Component(i // heads_per_layer, i % heads_per_layer) for i in sorted(chosen)]
    trainable = make_trainable(args.only, view, heads if args.only == "precise" else None)
    n_examples = args.batch_size * (args.steps + 1)
    ids = torch.randint(100, 32000, (n_examples, args.tokens), generator=gen).tolist()
    data = [TokenizedExample(f"random-{i}", tuple(row), args.tokens // 2) for i, row in enumerate(ids)]
    cfg = TrainConfig(
        lr=2e-5, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, max_steps=args.steps + 1,
        warmup_ratio=0.0, checkpoint_every=0,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        result = train(accelerator_for(device), trainable, data, 0, cfg, Path(out), {}, quiet=True)
    timed = result.log[1:]
    seconds = sum(row["seconds"] for row in timed)
    return {
        "method": args.only,
        "seconds_per_step": seconds / len(timed),
        "samples_per_second": len(timed) * args.batch_size / seconds,
        "trainable_parameters": sum(p.numel() for _, p in trainable.trainable_named()),
        "total_parameters": sum(p.numel() for p in model.parameters()),
        "peak_memory_gib": result.peak_memory["bytes"] / 2**30,
        "memory_kind": result.peak_memory["kind"],
        "build_seconds": built_s,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after one warm-up step)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per optimizer step")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per sequence (the loss covers half)")
    parser.add_argument("--heads", type=int, default=32, help="heads trained by precise SFT (spread at random)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096, help="d_model (heads of 128 dimensions)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", choices=["precise", "full"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_one(args)))
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("this benchmark needs a CUDA GPU (or --device cpu with a small --layers/--hidden)")
    results = {}
    for method in ("precise", "full"):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--only", method]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{method} SFT failed:\n{done.stderr[-3000:]}")
        results[method] = json.loads(done.stdout.strip().splitlines()[-1])
        r = results[method]
        print(f"{method:>8}: {r['seconds_per_step']:.2f} s/step, {r['samples_per_second']:.2f} samples/s, "
              f"trainable {r['trainable_parameters']:,} of {r['total_parameters']:,}, "
              f"peak memory {r['peak_memory_gib']:.1f} GiB ({r['memory_kind']}) on {r['device']}")  # fmt: skip
    precise, full = results["precise"], results["full"]
    speedup = precise["samples_per_second"] / full["samples_per_second"]
    memory_ratio = full["peak_memory_gib"] / precise["peak_memory_gib"]
    print(f"speedup precise / full: {speedup:.2f}x (paper: 3.3x on 8 A100s); peak memory full / precise: "
          f"{memory_ratio:.2f}x")  # fmt: skip
    record("gpu_finetune", args, {
        "speedup": speedup, "memory_ratio": memory_ratio,
        "precise_s_per_step": precise["seconds_per_step"], "full_s_per_step": full["seconds_per_step"],
        "precise_peak_gib": precise["peak_memory_gib"], "full_peak_gib": full["peak_memory_gib"],
    })  # fmt: skip


if __name__ == "__main__":
    main()
