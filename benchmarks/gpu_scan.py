"""Path-patching scan on a random-init LLaMA2-7B-shaped model (32 layers x 32 heads, fp16) on one GPU.

Times the fast engine on all 1,056 heads and MLPs for 256 random prompt pairs, and one per-component forward
pass for scale. Needs a CUDA GPU with ~20 GB free. Prints seconds, prompts/second and peak memory.

    python benchmarks/gpu_scan.py [--prompts 256] [--tokens 48] [--batch-size 64] [--layers 32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from record import record  # noqa: E402

from arithmech.models.archs import spec_for_model_type  # noqa: E402
from arithmech.models.sites import Component  # noqa: E402
from arithmech.models.view import ModelView  # noqa: E402
from arithmech.patching.path import PatchingBatch, path_patch  # noqa: E402

from reference_patching import ReferencePatcher  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU")
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=args.layers, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float16, attn_implementation="sdpa"
        ).eval()
    print(f"built random-init model in {time.perf_counter() - start:.1f} s; "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")
    view = ModelView(model, spec_for_model_type("llama"))
    gen = torch.Generator().manual_seed(0)
    ref = torch.randint(100, 32000, (args.prompts, args.tokens), generator=gen)
    cf = ref.clone()
    cf[:, args.tokens - 4] = torch.randint(100, 32000, (args.prompts,), generator=gen)
    mask = torch.ones_like(ref)
    end = torch.full((args.prompts,), args.tokens - 1)
    with torch.no_grad():
        answers = model(input_ids=ref[:8].cuda()).logits[:, -1].argmax(-1).cpu()
    batch = PatchingBatch(ref, mask, cf, mask, end, answers.repeat(args.prompts // 8 + 1)[: args.prompts])

    torch.cuda.reset_peak_memory_stats()
    path_patch(view, batch.select(slice(0, 8)), "path", batch_size=8)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = path_patch(view, batch, "path", batch_size=args.batch_size)
    torch.cuda.synchronize()
    fast_s = time.perf_counter() - start
    n_components = len(result.components)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"fast scan: {n_components} components x {args.prompts} prompts in {fast_s:.2f} s "
          f"({args.prompts / fast_s:.1f} prompts/s), peak memory {peak:.1f} GiB")

    reference = ReferencePatcher(view, batch.select(slice(0, args.batch_size)))
    reference.effect(Component(0, 0), "path")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for head in range(4):
        reference.effect(Component(args.layers // 2, head), "path")
    torch.cuda.synchronize()
    per_component = (time.perf_counter() - start) / 4 * (args.prompts / args.batch_size)
    loop_s = per_component * n_components
    print(f"per-component loop (4 components timed, scaled): {loop_s:.1f} s; speedup {loop_s / fast_s:.1f}x")
    record("gpu_scan", args, {
        "speedup": loop_s / fast_s, "fast_s": fast_s, "prompts_per_s": args.prompts / fast_s, "peak_memory_gib": peak,
    })  # fmt: skip


if __name__ == "__main__":
    main()
