"""Path-patching scan on a random-init LLaMA2-7B-shaped model (32 layers x 32 heads, fp16) on one GPU.

Times the fast engine on all 1,056 heads and MLPs for 256 random prompt pairs, and one per-component forward
pass for scale; then checks the scan against that loop (`tests/reference_patching.py`) on a few components (head
0.0, the four timed heads, the middle layer's MLP) over the first batch of prompts, as the CPU benchmarks do:
max |fast - loop| of the relative change, next to the largest |effect| there (so a check that passes because every
effect is ~0 shows as such). Needs a CUDA GPU with ~20 GB free. Prints seconds, prompts/second and peak memory,
and beside them `arithmech plan`'s for the same scan (plan_check.py: the same shape, config and prompt length; memory
planned above the weights against the allocator's peak above them, time estimated for the GPU's device profile
against the timed scan), so the first run on a GPU says how good the plan is. The model runs eager attention, as
arithmech loads every model (models/load.py), which the plan assumes. The shape options run it small on a CPU
(tests/unit/test_bench_gpu_scan.py).

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

from measured_peak import measure  # noqa: E402
from plan_check import planned_activations, profile_for, profile_label, side_by_side  # noqa: E402
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
            config, dtype=getattr(torch, args.dtype), attn_implementation="eager"
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

    path_patch(view, batch.select(slice(0, 8)), "path", batch_size=8)  # warm-up
    sync()
    result, measured = measure(lambda: path_patch(view, batch, "path", batch_size=args.batch_size), model, args.device)
    fast_s = measured.seconds
    n_components = len(result.components)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    peak = (weights + measured.tensor_bytes) / 2**30
    print(f"fast scan: {n_components} components x {args.prompts} prompts in {fast_s:.2f} s "
          f"({args.prompts / fast_s:.1f} prompts/s), peak memory {peak:.1f} GiB")
    plan, profile = scan_plan(config, args)
    planned = planned_activations(plan, weights)
    estimated = plan.seconds.get("single")
    print(f"plan of this scan: {side_by_side(planned, measured.tensor_bytes, estimated, fast_s, profile)}")

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
        "max_abs_diff": diff, "max_abs_effect": scale, "planned_gib": planned / 2**30,
        "measured_gib": measured.tensor_bytes / 2**30, "estimated_s": estimated or 0.0,
    }  # fmt: skip
    record("gpu_scan", args, metrics)
    return metrics


def scan_plan(config: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """`plan_stage`'s plan of the timed scan (identify's exact path scan of these prompts in these chunks) and how
    its time estimate's device is named."""
    from arithmech.plan.devices import device_profile
    from arithmech.plan.planner import PlanOptions, plan_stage
    from arithmech.plan.shape_sources import shape_from_config
    from arithmech.stages.identify_config import IdentifyConfig

    shape = shape_from_config(config.to_dict(), "gpu_scan", "benchmarks/gpu_scan.py")
    cfg = IdentifyConfig(max_prompts=args.prompts, batch_size=args.batch_size, variant="path", method="exact")
    profile = profile_for(args.device)
    options = PlanOptions(args.dtype, device_profile(profile), prompt_tokens=args.tokens)
    return plan_stage(shape, "identify", cfg, options), profile_label(profile, args.device)


def agreement(result: PatchResult, loop: dict[Component, Any], prompts: slice) -> tuple[float, float]:
    """(max |fast - loop|, max |loop|) over the components the loop computed and the prompts it saw."""
    rows = [result.components.index(c) for c in loop]
    fast = result.per_prompt[rows, prompts].float()  # [component, prompt]
    slow = torch.stack([effect.float().cpu() for effect in loop.values()])
    return float((fast - slow).abs().max()), float(slow.abs().max())


if __name__ == "__main__":
    main()
