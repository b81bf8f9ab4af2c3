"""Real width, real numerics: identify's effects and EAP-IG's edge scores in bfloat16 and float16 against float32
on the same weights (issue 33, item 4).

On each skeleton (benchmarks/skeletons.py: a preset's real widths, a few layers, the widened random init), the
float32 model is built, scored, then cast whole to each 16-bit dtype (the same weights, rounded) and scored again:
    identify  path patching's effect of every head and MLP (patching/path.py, `PatchResult.effects`, the mean
              relative change of the answer logit over the prompts)
    EAP-IG    the score of every edge of the circuit graph (circuits/attribution.edge_scores, 5 steps)
on the same prompts: random token ids of the test tokenizer, each counterfactual differing in the query's tokens
(QUERY before the end), the answers the float32 model's own top tokens.

Per dtype and method: the largest relative difference, max |x - x32| / max |x32| (relative to the largest score,
so scores near zero do not blow it up), Spearman's rank correlation, the top-32 agreement (the share of the 32
largest |scores| of float32 that are among the dtype's 32 largest), and non-finite values (inf or nan: overflow).
Beside them, per skeleton, the largest |value| of the residual stream and of the logits in the float32 run, and
its headroom below float16's largest number (65,504): the margin the float16 run has before it overflows.

    python benchmarks/skeleton_numerics.py --quick
    python benchmarks/skeleton_numerics.py --presets llama3.1-8b --layers 4
    python benchmarks/compare.py --full --only skeleton_numerics --update; python benchmarks/scale_tables.py --write
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from record import record
from skeletons import SKELETON_PRESETS, build_skeleton, skeleton_shape

from arithmech.circuits.attribution import edge_scores
from arithmech.circuits.batch import CircuitBatch
from arithmech.circuits.graph import CircuitGraph
from arithmech.models.archs import spec_for_model_type
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.view import ModelView
from arithmech.patching.path import PatchingBatch, path_patch

HALF_DTYPES = ("bfloat16", "float16")
TOP = 32
FLOAT16_MAX = float(torch.finfo(torch.float16).max)
QUERY = 5
"""Tokens at the end where a counterfactual differs from its prompt (plan/planner.QUERY_TOKENS)."""
FIRST_TOKEN, LAST_TOKEN = 33, 127
"""Printable bytes of the test tokenizer: the prompts' token ids."""


def prompts(n: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, tokens] prompts and their counterfactuals, differing only in the last QUERY tokens."""
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randint(FIRST_TOKEN, LAST_TOKEN, (n, tokens), generator=gen)
    cf = ref.clone()
    cf[:, -QUERY:] = torch.randint(FIRST_TOKEN, LAST_TOKEN, (n, QUERY), generator=gen)
    return ref, cf


def largest_values(view: ModelView, ids: torch.Tensor) -> dict[str, float]:
    """The largest |value| of the residual stream (every layer's output) and of the logits in one forward pass."""
    largest = [0.0]

    def keep(_module: Any, _args: Any, output: Any) -> None:
        largest[0] = max(largest[0], float(first_tensor(output).detach().abs().float().max()))

    with torch.no_grad(), hooks(post=[(block, keep) for block in view.blocks]):
        logits = view.model(input_ids=ids).logits
    return {"residual": largest[0], "logits": float(logits.abs().float().max())}


def scores(model: Any, ref: torch.Tensor, cf: torch.Tensor, answers: torch.Tensor, cf_answers: torch.Tensor,
           steps: int, batch_size: int) -> dict[str, torch.Tensor]:  # fmt: skip
    """identify's effects [component] and EAP-IG's edge scores [edge] of the model as it is (its dtype)."""
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    mask = torch.ones_like(ref)
    end = torch.full((len(ref),), ref.shape[1] - 1)
    patch = path_patch(view, PatchingBatch(ref, mask, cf, mask.clone(), end, answers), "path", batch_size=batch_size)
    graph = CircuitGraph.from_dims(view.dims)
    batch = CircuitBatch(ref, cf, mask, answers, cf_answers)
    edges = edge_scores(view, graph, batch, method="eap-ig", steps=steps, batch_size=batch_size)
    return {"identify": patch.effects.float(), "eap-ig": edges[graph.valid.bool()].float()}


def compare(x: torch.Tensor, reference: torch.Tensor, top: int = TOP) -> dict[str, float | int]:
    """The module docstring's measures of `x` against the float32 `reference` (1-D, same order)."""
    finite = torch.isfinite(x)
    nonfinite = int((~finite).sum())
    scale = float(reference.abs().max())
    diff = float((x - reference).abs().max()) if nonfinite == 0 else float("inf")
    k = min(top, reference.numel())
    top_ref = set(reference.abs().topk(k).indices.tolist())
    top_x = set(torch.where(finite, x.abs(), torch.zeros_like(x)).topk(k).indices.tolist())
    return {"max_rel_diff": diff / scale if scale > 0 else 0.0, "spearman": spearman(x, reference),
            "top_agreement": len(top_ref & top_x) / k, "nonfinite": nonfinite}  # fmt: skip


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman's rank correlation (ties broken by order; non-finite values rank last)."""
    x = torch.nan_to_num(x.double(), nan=float("-inf"))

    def ranks(v: torch.Tensor) -> torch.Tensor:
        return v.argsort().argsort().double()

    rx, ry = ranks(x), ranks(y.double())
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()))


def skeleton_rows(preset: str, layers: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """float32, then each 16-bit dtype, on one skeleton (rebuilt from its seed, then cast: the same weights)."""
    shape = skeleton_shape(preset, layers, args.quick)
    model = build_skeleton(shape, "float32", args.seed, args.device)
    ref, cf = prompts(args.prompts, args.tokens, args.seed)
    ref, cf = ref.to(args.device), cf.to(args.device)
    view = ModelView(model, spec_for_model_type(model.config.model_type))
    with torch.no_grad():
        answers = model(input_ids=ref).logits[:, -1].argmax(-1)
        cf_answers = model(input_ids=cf).logits[:, -1].argmax(-1)
    largest = largest_values(view, ref)
    reference = scores(model, ref, cf, answers, cf_answers, args.steps, args.batch_size)
    rows = []
    for dtype in args.dtypes:
        if model.dtype != torch.float32:  # an earlier dtype's cast: the float32 weights again
            del model, view
            gc.collect()
            model = build_skeleton(shape, "float32", args.seed, args.device)
        model = model.to(getattr(torch, dtype))
        view = ModelView(model, spec_for_model_type(model.config.model_type))
        half = scores(model, ref, cf, answers, cf_answers, args.steps, args.batch_size)
        for method, values in half.items():
            rows.append({"preset": preset, "layers": layers, "dtype": dtype, "method": method,
                         "scores": int(values.numel()), **compare(values, reference[method]),
                         "largest_residual": largest["residual"], "largest_logit": largest["logits"],
                         "float16_headroom": FLOAT16_MAX / max(largest["residual"], largest["logits"])})  # fmt: skip
    del model, view
    gc.collect()
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """results.json's entry: the extremes compare.py shows, and every row."""
    return {
        "rows_measured": len(rows),
        "nonfinite": sum(r["nonfinite"] for r in rows),
        "max_rel_diff_bfloat16": max((r["max_rel_diff"] for r in rows if r["dtype"] == "bfloat16"), default=0.0),
        "max_rel_diff_float16": max((r["max_rel_diff"] for r in rows if r["dtype"] == "float16"), default=0.0),
        "min_top_agreement": min((r["top_agreement"] for r in rows), default=0.0),
        "rows": list(rows),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(SKELETON_PRESETS))
    parser.add_argument("--layers", default="2,4", help="comma-separated depths")
    parser.add_argument("--dtypes", default=",".join(HALF_DTYPES), help="16-bit dtypes compared with float32")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--steps", type=int, default=5, help="EAP-IG's interpolation steps")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="tiny widths of the same proportions (seconds)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in SKELETON_PRESETS]
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if unknown or any(d not in HALF_DTYPES for d in args.dtypes):
        sys.exit(f"presets are {', '.join(SKELETON_PRESETS)} and dtypes {', '.join(HALF_DTYPES)}")
    start = time.perf_counter()
    rows = []
    for preset in presets:
        for layers in (int(n) for n in args.layers.split(",") if n.strip()):
            for row in skeleton_rows(preset, layers, args):
                rows.append(row)
                print(f"{preset} x {layers} {row['dtype']:>8} {row['method']:<8} max rel. diff "
                      f"{row['max_rel_diff']:.2e}, Spearman {row['spearman']:.4f}, top-{TOP} {row['top_agreement']:.2f}"
                      f", non-finite {row['nonfinite']}; float32's largest |residual| {row['largest_residual']:.3g}, "
                      f"|logit| {row['largest_logit']:.3g}", flush=True)  # fmt: skip
    metrics = summary(rows)
    print(f"{len(rows)} comparisons in {time.perf_counter() - start:.0f} s; {metrics['nonfinite']} non-finite values")
    record("skeleton_numerics", args, metrics)
    return metrics


if __name__ == "__main__":
    main()
