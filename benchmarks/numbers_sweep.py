"""The numbers stage's family x layer sweep (`arithmech analyze numbers`) vs one patched forward pass per variant.

The stage runs each site's clean and corrupted prompts once (`patching/subspace.base_run`) and every variant
(the whole layer, each family's patch of the clean and of another value, each shuffled control's, the ablations)
as a row that joins those runs at its layer, on the positions from the site on (`stages/numbers_patching.py`).
The naive way runs one full forward pass of the pair per variant, with a hook that writes the patch at the
layer's input. This script runs the stage, counts both in one unit and checks some cells against the naive way:

- forward-pass equivalents: token-layers run / (n_layers x tokens of the patched corrupted prompts), so one
  forward pass of every site's pairs is 1. `sweep_passes` is the stage's patching (bases and rows, counted by the
  stage's own `TokenLayers`); `naive_passes` is one pass per variant per pair; `work_ratio` their ratio;
  `stage_passes` the stage's whole count in its own unit (metadata.json `forward_pass_equivalents.total`: the
  grid's prompt set once, partners and patching included);
- correctness: --check-cells (site, layer, family) cells redone pair by pair with plain forward hooks on the
  whole model; their mean LD must equal the stage's (`max_abs_diff`);
- time: the stage's seconds against the naive loop's, timed on the checked cells and scaled to every variant
  (`speedup`, sampled and scaled, as benchmarks/gpu_scan.py's loop).

    python benchmarks/numbers_sweep.py [--max-prompts 16] [--layers 0,8,16,24] [--sites a.tens,a.units] [--model ID]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch
from record import record

from arithmech.analysis.number_fits import Fit
from arithmech.models.load import ModelConfig, load_model
from arithmech.stages.numbers import NumbersResult, PatchedPair, analyze_numbers
from arithmech.stages.numbers_config import NumbersConfig


def variants_per_pair(result: NumbersResult, site: str) -> int:
    """Rows the stage patches per pair at `site`: per layer the whole layer, two per fit (the clean value and
    another; every shuffled control is a fit), and the two ablations of each family."""
    keys = [key for key in result.fits if key[0] == site]
    families = [key for key in keys if key[3] == 0]
    return len(result.layers) + 2 * len(keys) + 2 * len(families)


def hooked_ld(model: Any, blocks: Sequence[Any], ids: list[int], layer: int, pos: int, fit: Fit, value: int,
              good: int, bad: int) -> float:  # fmt: skip
    """LD at the last token of one full forward pass whose residual entering `layer` at `pos` is patched to
    h + Q Q^T (f(value) - h), h its own value there."""
    device = next(model.parameters()).device

    def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        hidden = (args[0] if args else kwargs["hidden_states"]).clone()  # [1, pos, d_model]
        h = hidden[0, pos].double().cpu()
        patched = h + fit.q @ (fit.q.T @ (fit.pred[value] - h))
        hidden[0, pos] = patched.to(hidden.device, hidden.dtype)
        return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})

    handle = blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].float()
    finally:
        handle.remove()
    return float(logits[good] - logits[bad])


def check_cell(result: NumbersResult, handle: Any, site: str, layer: int, family: str) -> tuple[float, float, int]:
    """(|stage's mean LD - hooked mean LD| over the cell's train pairs, seconds, forward passes run)."""
    fit, low = result.fits[(site, layer, family, 0)], result.metadata["range"]["low"]
    pairs: list[PatchedPair] = [p for p in result.pairs[site] if not p.heldout]
    start = time.perf_counter()
    lds = [hooked_ld(handle.model, handle.view.blocks, p.partner.ids, layer, p.position, fit, p.value - low,
                     p.partner.good, p.partner.bad) for p in pairs]  # fmt: skip
    seconds = time.perf_counter() - start
    row = next(r for r in result.rows if (r["site"], r["layer"], r["family"]) == (site, layer, family))
    return abs(float(row["ld"]) - sum(lds) / len(lds)), seconds, len(pairs)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-prompts", type=int, default=16, help="pairs patched per site")
    parser.add_argument("--max-pairs", type=int, default=240, help="operand pairs in the grid")
    parser.add_argument("--layers", default="0,8,16,24")
    parser.add_argument("--sites", default="a.tens,a.units")
    parser.add_argument("--shuffles", type=int, default=3)
    parser.add_argument("--families", default=None, help="families fitted, by kind or name (default all)")
    parser.add_argument("--few-shot", type=int, default=3)
    parser.add_argument("--low", type=int, default=None)
    parser.add_argument("--high", type=int, default=None)
    parser.add_argument("--no-filter-correct", action="store_true", help="patch prompts the model gets wrong too")
    parser.add_argument("--check-cells", type=int, default=2, help="cells redone with plain hooks")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if "clock" in args.sites.split(","):
        parser.error("--sites: the operand sites only (the Clock's rows are not a family x layer sweep of pairs)")
    handle = load_model(ModelConfig(model=args.model, device=args.device, dtype=args.dtype))
    cfg = NumbersConfig(low=args.low, high=args.high, max_pairs=args.max_pairs, max_prompts=args.max_prompts,
                        few_shot=args.few_shot, layers=tuple(int(x) for x in args.layers.split(",")),
                        sites=tuple(args.sites.split(",")), shuffles=args.shuffles,
                        families=tuple(args.families.split(",")) if args.families else None,
                        filter_correct=not args.no_filter_correct, seed=args.seed)  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        result = analyze_numbers(handle, cfg, out, quiet=True)
        stage_s = time.perf_counter() - start

    n_layers = handle.dims.n_layers
    per_site = {site: sum(len(p.partner.ids) for p in pairs) for site, pairs in result.pairs.items()}
    unit = n_layers * sum(per_site.values())  # token-layers of one forward pass of every site's pairs
    parts = result.metadata["forward_pass_equivalents"]
    token_layers = result.metadata["token_layers"]
    sweep = (token_layers["bases"] + token_layers["rows"]) / unit
    naive = sum(variants_per_pair(result, site) * n_layers * tokens for site, tokens in per_site.items()) / unit

    cells = [(r["site"], int(r["layer"]), r["family"]) for r in result.rows
             if r["kind"] not in ("layer", "pca") and not r["control"]][: args.check_cells]  # fmt: skip
    diff, loop_s, loop_passes = 0.0, 0.0, 0
    for site, layer, family in cells:
        d, s, n = check_cell(result, handle, site, layer, family)
        diff, loop_s, loop_passes = max(diff, d), loop_s + s, loop_passes + n
    all_passes = sum(variants_per_pair(result, site) * len(pairs) for site, pairs in result.pairs.items())
    naive_s = loop_s / max(loop_passes, 1) * all_passes
    dims = handle.dims
    print(f"model {handle.source.get('model')}: {dims.n_layers} layers, d_model {dims.d_model}; sites "
          f"{', '.join(result.pairs)}; layers {result.layers}; {sum(len(p) for p in result.pairs.values())} pairs")
    print("variants per pair: " + ", ".join(f"{s} {variants_per_pair(result, s)}" for s in result.pairs))
    print(f"family x layer sweep: {sweep:.2f} forward passes of the pairs (the stage's count: bases and rows); "
          f"one pass per variant: {naive:.1f}; {naive / sweep:.1f}x less work")
    print(f"the whole stage: {parts['total']:.2f} forward passes of the grid's prompt set ({stage_s:.1f} s); the "
          f"naive loop {naive_s:.1f} s (timed on {loop_passes} passes, scaled to {all_passes}): "
          f"{naive_s / stage_s:.1f}x")
    print(f"max |stage - plain hooks| of the mean LD over {len(cells)} cells: {diff:.2e}")
    metrics = {"sweep_passes": sweep, "naive_passes": naive, "work_ratio": naive / sweep,
               "stage_passes": parts["total"], "stage_s": stage_s, "naive_s": naive_s, "speedup": naive_s / stage_s,
               "max_abs_diff": diff, "pairs": sum(len(p) for p in result.pairs.values()),
               "variants": all_passes}  # fmt: skip
    record("numbers_sweep", args, metrics)
    return metrics


if __name__ == "__main__":
    main()
