"""Fast path patching vs the usual one-forward-pass-per-component loop, on the same prompts, in one run.

The loop is timed on a sample of components spread over the layers and scaled to all of them (it costs the
same for every component); the fast engine is timed on all components. Prints the ratio.

    python benchmarks/path_patching.py [--prompts 64] [--sample 12] [--model ID_OR_PATH] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from record import record  # noqa: E402

from arithmech.data.reference_config import ReferenceSetConfig  # noqa: E402
from arithmech.data.reference_set import build_reference_set  # noqa: E402
from arithmech.models.load import ModelConfig, load_model  # noqa: E402
from arithmech.models.sites import all_components  # noqa: E402
from arithmech.patching.path import PatchingBatch, path_patch  # noqa: E402

from reference_patching import ReferencePatcher  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--sample", type=int, default=12, help="components timed in the loop")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    handle = load_model(ModelConfig(model=args.model, device=args.device, dtype=args.dtype))
    cfg = ReferenceSetConfig(max_prompts=args.prompts, n_per_template=max(16, args.prompts // 4))
    t = build_reference_set(handle, cfg).tokenized
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    components = all_components(handle.dims)
    print(f"model {handle.source.get('model')}: {handle.dims.n_layers} layers x {handle.dims.n_heads} heads; "
          f"{len(batch)} prompt pairs, {int(t.ref_mask.sum()) / len(batch):.1f} tokens per prompt on average")

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    sync()
    start = time.perf_counter()
    fast = path_patch(handle.view, batch, "path", batch_size=args.batch_size)
    sync()
    fast_s = time.perf_counter() - start

    step = max(1, len(components) // args.sample)
    sample = components[::step][: args.sample]
    reference = ReferencePatcher(handle.view, batch)  # its two caching passes are not counted
    sync()
    start = time.perf_counter()
    worst = 0.0
    for component in sample:
        effect = reference.effect(component, "path")
        index = components.index(component)
        worst = max(worst, float((effect - fast.per_prompt[index]).abs().max()))
    sync()
    loop_s = (time.perf_counter() - start) / len(sample) * len(components)

    print(f"fast path patching, all {len(components)} components: {fast_s:.2f} s")
    print(f"per-component loop, {len(sample)} components timed, scaled to {len(components)}: {loop_s:.1f} s")
    print(f"max |fast - loop| on the sampled components: {worst:.2e}")
    print(f"speedup: {loop_s / fast_s:.1f}x")
    record("path_patching", args, {
        "speedup": loop_s / fast_s, "fast_s": fast_s, "loop_s": loop_s, "max_abs_diff": worst,
    })  # fmt: skip


if __name__ == "__main__":
    main()
