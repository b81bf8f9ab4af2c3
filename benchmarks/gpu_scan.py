"""Path-patching scan on a random-init LLaMA2-7B-shaped model (32 layers x 32 heads, fp16) on one GPU.

Times the fast engine on all 1,056 heads and MLPs for 256 random prompt pairs, and one per-component forward
pass for scale; then checks the scan against that loop (`tests/reference_patching.py`) on a few components (head
0.0, the four timed heads, the middle layer's MLP) over the first batch of prompts, as the CPU benchmarks do:
max |fast - loop| of the relative change, next to the largest |effect| there (so a check that passes because every
effect is ~0 shows as such). Needs a CUDA GPU with ~20 GB free. Prints seconds, prompts/second and peak memory.
The shape options run it small on a CPU (tests/unit/test_bench_gpu_scan.py).

    python benchmarks/gpu_scan.py [--prompts 256] [--tokens 48] [--batch-size 64] [--layers 32]
        [--device cuda] [--dtype float16] [--hidden 4096] [--heads 32] [--intermediate 11008] [--vocab 32000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from record import record  # noqa: E402

from arithmech.models.archs import spec_for_model_type  # noqa: E402
from arithmech.models.sites import Component  # noqa: E402
from arithmech.models.view import ModelView  # noqa: E402
from arithmech.patching.path import PatchingBatch, PatchResult, path_patch  # noqa: E402

from reference_patching import ReferencePatcher  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--intermediate", type=int, default=11008)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU (or a small shape with --device cpu)")
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.heads, vocab_size=args.vocab,
        max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=getattr(torch, args.dtype), attn_implementation="sdpa"
        ).eval()
    print(f"built random-init model in {time.perf_counter() - start:.1f} s; "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")
    view = ModelView(model, spec_for_model_type("llama"))
    gen = torch.Generator().manual_seed(0)
    ref = torch.randint(100, args.vocab, (args.prompts, args.tokens), generator=gen)
    cf = ref.clone()
    cf[:, args.tokens - 4] = torch.randint(100, args.vocab, (args.prompts,), generator=gen)
    mask = torch.ones_like(ref)
    end = torch.full((args.prompts,), args.tokens - 1)
    with torch.no_grad():
        answers = model(input_ids=ref[:8].to(args.device)).logits[:, -1].argmax(-1).cpu()
    batch = PatchingBatch(ref, mask, cf, mask, end, answers.repeat(args.prompts // 8 + 1)[: args.prompts])

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    path_patch(view, batch.select(slice(0, 8)), "path", batch_size=8)  # warm-up
    sync()
    start = time.perf_counter()
    result = path_patch(view, batch, "path", batch_size=args.batch_size)
    sync()
    fast_s = time.perf_counter() - start
    n_components = len(result.components)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    print(f"fast scan: {n_components} components x {args.prompts} prompts in {fast_s:.2f} s "
          f"({args.prompts / fast_s:.1f} prompts/s), peak memory {peak:.1f} GiB")

    first = slice(0, min(args.batch_size, args.prompts))
    reference = ReferencePatcher(view, batch.select(first))
    checked = {Component(0, 0): reference.effect(Component(0, 0), "path")}
    timed = [Component(args.layers // 2, head) for head in range(min(4, args.heads))]
    sync()
    start = time.perf_counter()
    for head in timed:
        checked[head] = reference.effect(head, "path")
    sync()
    per_component = (time.perf_counter() - start) / len(timed) * (args.prompts / (first.stop - first.start))
    loop_s = per_component * n_components
    print(f"per-component loop ({len(timed)} components timed, scaled): {loop_s:.1f} s; speedup {loop_s / fast_s:.1f}x")
    mlp = Component(args.layers // 2)
    checked[mlp] = reference.effect(mlp, "path")
    diff, scale = agreement(result, checked, first)
    print(f"max |fast - loop| on {len(checked)} components x {first.stop} prompts: {diff:.2e} "
          f"(largest |effect| there {scale:.2e})")
    metrics = {
        "speedup": loop_s / fast_s, "fast_s": fast_s, "prompts_per_s": args.prompts / fast_s, "peak_memory_gib": peak,
        "max_abs_diff": diff, "max_abs_effect": scale,
    }  # fmt: skip
    record("gpu_scan", args, metrics)
    return metrics


def agreement(result: PatchResult, loop: dict[Component, Any], prompts: slice) -> tuple[float, float]:
    """(max |fast - loop|, max |loop|) over the components the loop computed and the prompts it saw."""
    rows = [result.components.index(c) for c in loop]
    fast = result.per_prompt[rows, prompts].float()  # [component, prompt]
    slow = torch.stack([effect.float().cpu() for effect in loop.values()])
    return float((fast - slow).abs().max()), float(slow.abs().max())


if __name__ == "__main__":
    main()
