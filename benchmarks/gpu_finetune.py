"""Precise SFT (32 heads) vs full SFT steps on a random-init LLaMA2-7B-shaped model in bfloat16, on one GPU.

The paper's setting (Zhang et al. 2024, sec. 5.3: top-32 heads of LLaMA2-7B, 3.3x the samples/second of full
SFT) at the scale of one optimizer step: each method runs in its own process (so CUDA peak memory is its own)
on the same random token sequences through the same training loop (`arithmech.finetune.train`); the first step
is a warm-up and is not timed. Full SFT of 6.7B parameters with AdamW needs about 110 GB (bf16 weights and
gradients, fp32 moments): an H100/H200-class GPU, or --layers 16 for half the model. Prints seconds per step,
samples/second and peak memory of each method and their ratios, and beside each method `arithmech plan`'s plan of
the same training (plan_check.py: the same shape, heads, batch and sequence length; memory planned above the weights
against the allocator's peak above them, time per step estimated for the GPU's device profile against the timed
steps), so the first run on a GPU says how good the plan is. The model runs eager attention, as arithmech loads
every model (models/load.py), which the plan assumes.

    python benchmarks/gpu_finetune.py [--steps 3] [--batch-size 8] [--tokens 256] [--heads 32] [--layers 32]
    python benchmarks/gpu_finetune.py --device cpu --layers 2 --hidden 256 --vocab 512   # a smoke test of the script
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from plan_check import planned_activations, profile_for, profile_label, side_by_side
from record import record


def run_one(args: argparse.Namespace) -> dict[str, object]:
    """Train with one method in this process and return its measurements."""
    import torch
    from measured_peak import measure
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
        num_attention_heads=heads_per_layer, num_key_value_heads=heads_per_layer, vocab_size=args.vocab,
        max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    start = time.perf_counter()
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="eager")
    built_s = time.perf_counter() - start
    view = ModelView(model, spec_for_model_type("llama"))
    gen = torch.Generator().manual_seed(1)
    chosen = torch.randperm(args.layers * heads_per_layer, generator=gen)[: args.heads].tolist()
    heads = [Component(i // heads_per_layer, i % heads_per_layer) for i in sorted(chosen)]
    trainable = make_trainable(args.only, view, heads if args.only == "precise" else None)
    made = {id(p): p for p in [*model.parameters(), *(p for _, p in trainable.trainable_named())]}
    loaded = sum(p.numel() * p.element_size() for p in made.values())  # the weights and precise SFT's deltas
    n_examples = args.batch_size * (args.steps + 1)
    ids = torch.randint(100, args.vocab, (n_examples, args.tokens), generator=gen).tolist()
    data = [TokenizedExample(f"random-{i}", tuple(row), args.tokens // 2) for i, row in enumerate(ids)]
    cfg = TrainConfig(
        lr=2e-5, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, max_steps=args.steps + 1,
        warmup_ratio=0.0, checkpoint_every=0,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        result, measured = measure(
            lambda: train(accelerator_for(device), trainable, data, 0, cfg, Path(out), {}, quiet=True), model,
            args.device,
        )  # fmt: skip
    timed = result.log[1:]
    seconds = sum(row["seconds"] for row in timed)
    plan, profile = training_plan(config, heads, args)
    return {
        "planned_bytes": planned_activations(plan, loaded),
        "measured_bytes": measured.tensor_bytes,
        "estimated_s_per_step": plan.seconds["single"] / (args.steps + 1),
        "profile": profile,
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


def training_plan(config: object, heads: list[object], args: argparse.Namespace) -> tuple[object, str]:
    """`plan_stage`'s plan of the training run (the chosen heads, or every parameter) and how its time estimate's
    device is named."""
    from arithmech.plan.devices import device_profile
    from arithmech.plan.planner import PlanOptions, plan_stage
    from arithmech.plan.shape_sources import shape_from_config
    from arithmech.stages.finetune_config import FinetuneConfig

    shape = shape_from_config(config.to_dict(), "gpu_finetune", "benchmarks/gpu_finetune.py")  # type: ignore[attr-defined]
    names = tuple(str(h) for h in heads) if args.only == "precise" else None
    cfg = FinetuneConfig(method=args.only, components=names, batch_size=args.batch_size,
                         micro_batch_size=args.micro_batch_size, max_steps=args.steps + 1)  # fmt: skip
    profile = profile_for(args.device)
    options = PlanOptions("bfloat16", device_profile(profile), prompt_tokens=args.tokens)
    return plan_stage(shape, "finetune", cfg, options), profile_label(profile, args.device)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after one warm-up step)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per optimizer step")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per sequence (the loss covers half)")
    parser.add_argument("--heads", type=int, default=32, help="heads trained by precise SFT (spread at random)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096, help="d_model (heads of 128 dimensions)")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary (LLaMA2's by default)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", choices=["precise", "full"], default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.only:
        print(json.dumps(run_one(args)))
        return {}
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("this benchmark needs a CUDA GPU (or --device cpu with a small --layers/--hidden)")
    results = {}
    for method in ("precise", "full"):
        cmd = [sys.executable, __file__, *argv, "--only", method]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{method} SFT failed:\n{done.stderr[-3000:]}")
        results[method] = json.loads(done.stdout.strip().splitlines()[-1])
        r = results[method]
        print(f"{method:>8}: {r['seconds_per_step']:.2f} s/step, {r['samples_per_second']:.2f} samples/s, "
              f"trainable {r['trainable_parameters']:,} of {r['total_parameters']:,}, "
              f"peak memory {r['peak_memory_gib']:.1f} GiB ({r['memory_kind']}) on {r['device']}")  # fmt: skip
        both = side_by_side(r["planned_bytes"], r["measured_bytes"], r["estimated_s_per_step"], r["seconds_per_step"],
                            r["profile"])  # fmt: skip
        print(f"{'':>8}  plan of this training: {both} (time per step)")
    precise, full = results["precise"], results["full"]
    speedup = precise["samples_per_second"] / full["samples_per_second"]
    memory_ratio = full["peak_memory_gib"] / precise["peak_memory_gib"]
    print(f"speedup precise / full: {speedup:.2f}x (paper: 3.3x on 8 A100s); peak memory full / precise: "
          f"{memory_ratio:.2f}x")  # fmt: skip
    metrics = {
        "speedup": speedup, "memory_ratio": memory_ratio,
        "precise_s_per_step": precise["seconds_per_step"], "full_s_per_step": full["seconds_per_step"],
        "precise_peak_gib": precise["peak_memory_gib"], "full_peak_gib": full["peak_memory_gib"],
        **{f"{m}_{k}": results[m][v] / scale for m in ("precise", "full") for k, v, scale in (
            ("planned_gib", "planned_bytes", 2**30), ("measured_gib", "measured_bytes", 2**30),
            ("estimated_s_per_step", "estimated_s_per_step", 1))},
    }  # fmt: skip
    record("gpu_finetune", args, metrics)
    return metrics


if __name__ == "__main__":
    main()
