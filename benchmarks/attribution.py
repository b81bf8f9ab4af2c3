"""Attribution patching vs exact path patching, on the same prompts, in one run: time and agreement.

Runs the exact fast engine (`path_patch`) and the first-order estimate (`attribution_patch`) on one
reference set of the default model (or --model), prints both times, their ratio, and `compare_methods`
(Spearman over all components, heads, MLPs; top-k overlap with top = most negative effect).

    python benchmarks/attribution.py [--prompts 64] [--variant path] [--model ID_OR_PATH] [--device cpu]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from record import record
from timing import best_time

from arithmech.analysis.agreement import compare_methods, top_k
from arithmech.data.reference_config import ReferenceSetConfig
from arithmech.data.reference_set import build_reference_set
from arithmech.models.load import ModelConfig, load_model
from arithmech.patching.attribution import attribution_patch
from arithmech.patching.path import PatchingBatch, PatchResult, path_patch
from arithmech.patching.variants import VARIANTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--variant", default="path", choices=VARIANTS)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each method; the best is shown")
    args = parser.parse_args()

    torch.manual_seed(0)
    handle = load_model(ModelConfig(model=args.model, device=args.device, dtype=args.dtype))
    cfg = ReferenceSetConfig(max_prompts=args.prompts, n_per_template=max(16, args.prompts // 4))
    t = build_reference_set(handle, cfg).tokenized
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    dims = handle.dims
    tokens = int(t.ref_mask.sum()) / len(batch)
    print(f"model {handle.source.get('model')}: {dims.n_layers} layers x {dims.n_heads} heads; "
          f"{len(batch)} prompt pairs, {tokens:.1f} tokens per prompt on average; variant {args.variant}")

    def timed(fn: Callable[[], PatchResult]) -> tuple[PatchResult, float]:
        return best_time(fn, args.repeats)

    exact, exact_s = timed(lambda: path_patch(handle.view, batch, args.variant, batch_size=args.batch_size))
    approx, approx_s = timed(
        lambda: attribution_patch(handle.view, batch, args.variant, batch_size=args.batch_size)
    )
    n = len(exact.components)
    print(f"exact path_patch, all {n} components:    {exact_s:.2f} s")
    print(f"attribution_patch, all {n} components:   {approx_s:.2f} s")
    print(f"time ratio exact / attribution: {exact_s / approx_s:.1f}x")
    agreement = compare_methods(exact, approx, ks=(5, 10, 20))
    for key, value in agreement.items():
        print(f"{key:>16}: {value:.3f}")
    print(f"whole-prompt effect: {exact.total_effect:+.3f}")
    for name, result in (("exact", exact), ("attribution", approx)):
        effects = result.effects
        top = [f"{result.components[i].name} ({float(effects[i]):+.3f})" for i in top_k(effects, 10)]
        print(f"top-10 {name:>11}: {', '.join(top)}")
    record("attribution", args, {
        "speedup": exact_s / approx_s, "exact_s": exact_s, "attribution_s": approx_s,
        "spearman_all": agreement["spearman_all"], "spearman_heads": agreement["spearman_heads"],
        "spearman_mlps": agreement["spearman_mlps"], "top10_overlap": agreement["top10_overlap"],
    })  # fmt: skip


if __name__ == "__main__":
    main()
