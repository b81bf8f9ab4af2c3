"""Fast path patching vs the usual one-forward-pass-per-component loop, on the same prompts, in one run.

Both variants users compare: path (attention frozen, the paper's) and total (activation patching at END, what
TransformerLens and nnsight compute). The loop is timed on a sample of components spread over the layers and
scaled to all of them (it costs the same for every component); the fast engine is timed on all components.
Prints the ratios, and each scan's work counted in plain forward passes of the batch (linear-layer
multiply-accumulates, tests/forward_cost.py: deterministic, whatever the machine's load).

    python benchmarks/path_patching.py [--prompts 64] [--sample 12] [--model ID_OR_PATH] [--device cpu]
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

from arithmech.data.reference_config import ReferenceSetConfig  # noqa: E402
from arithmech.data.reference_set import build_reference_set  # noqa: E402
from arithmech.models.load import ModelConfig, load_model  # noqa: E402
from arithmech.models.sites import all_components  # noqa: E402
from arithmech.patching.path import PatchingBatch, path_patch  # noqa: E402

from forward_cost import count_work, plain_forward_macs  # noqa: E402
from reference_patching import ReferencePatcher  # noqa: E402


def arguments(doc: str, prompts: int) -> argparse.ArgumentParser:
    """The options of a fast-engine-vs-loop benchmark (this one and benchmarks/answer_digits.py)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=prompts, help="prompt pairs")
    parser.add_argument("--sample", type=int, default=12, help="components timed in the loop")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=64)
    return parser


def main() -> None:
    args = arguments(__doc__, prompts=64).parse_args()

    torch.manual_seed(0)
    handle = load_model(ModelConfig(model=args.model, device=args.device, dtype=args.dtype))
    cfg = ReferenceSetConfig(max_prompts=args.prompts, n_per_template=max(16, args.prompts // 4))
    t = build_reference_set(handle, cfg).tokenized
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    components = all_components(handle.dims)
    print(f"model {handle.source.get('model')}: {handle.dims.n_layers} layers x {handle.dims.n_heads} heads; "
          f"{len(batch)} prompt pairs, {int(t.ref_mask.sum()) / len(batch):.1f} tokens per prompt on average")

    fast_s, passes, loop_s, worst = measure(handle, batch, args.sample, args.batch_size)
    for variant in ("path", "total"):
        print(f"{variant}: fast engine, all {len(components)} components: {fast_s[variant]:.2f} s, "
              f"{passes[variant]:.2f} plain forward passes of the batch")
        print_loop(variant, fast_s, loop_s, worst, args.sample, len(components))
    record("path_patching", args, metrics(fast_s, passes, loop_s, worst))


Timings = dict[str, float]


def measure(
    handle: Any, batch: PatchingBatch, n_sample: int, batch_size: int
) -> tuple[Timings, Timings, Timings, Timings]:
    """Per variant (path, total): the fast engine's seconds on all components and its work in plain forward
    passes of the batch; the loop's seconds scaled to all components, and its largest difference to the engine."""
    components = all_components(handle.dims)

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    unit = plain_forward_macs(handle.model, batch.ref_ids, batch.ref_mask)
    fast, fast_s, passes = {}, {}, {}
    for variant in ("path", "total"):
        sync()
        start = time.perf_counter()
        with count_work(handle.model) as work:
            fast[variant] = path_patch(handle.view, batch, variant, batch_size=batch_size)
        sync()
        fast_s[variant] = time.perf_counter() - start
        passes[variant] = work.macs / unit

    step = max(1, len(components) // n_sample)
    sample = components[::step][:n_sample]
    reference = ReferencePatcher(handle.view, batch)  # its two caching passes are not counted
    loop_s, worst = {}, {}
    for variant in ("path", "total"):
        sync()
        start = time.perf_counter()
        worst[variant] = 0.0
        for component in sample:
            effect = reference.effect(component, variant)
            index = components.index(component)
            worst[variant] = max(worst[variant], float((effect - fast[variant].per_prompt[index]).abs().max()))
        sync()
        loop_s[variant] = (time.perf_counter() - start) / len(sample) * len(components)
    return fast_s, passes, loop_s, worst


def metrics(fast_s: Timings, passes: Timings, loop_s: Timings, worst: Timings) -> dict[str, float]:
    """What `record` keeps of `measure`'s numbers."""
    return {
        "speedup": loop_s["path"] / fast_s["path"], "fast_s": fast_s["path"], "loop_s": loop_s["path"],
        "max_abs_diff": worst["path"], "path_passes": passes["path"],
        "total_speedup": loop_s["total"] / fast_s["total"], "total_s": fast_s["total"],
        "total_loop_s": loop_s["total"], "total_max_abs_diff": worst["total"], "total_passes": passes["total"],
    }  # fmt: skip


def print_loop(variant: str, fast_s: Timings, loop_s: Timings, worst: Timings, n_sample: int, n: int) -> None:
    print(f"{variant}: per-component loop, {n_sample} components timed, scaled to {n}: {loop_s[variant]:.1f} s")
    print(f"{variant}: max |fast - loop| on the sampled components: {worst[variant]:.2e}")
    print(f"{variant}: speedup {loop_s[variant] / fast_s[variant]:.1f}x")


if __name__ == "__main__":
    main()
