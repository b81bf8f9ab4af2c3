"""Activation patching of every head's END output: arithmech vs TransformerLens and nnsight, same prompts, one run.

The work: the reference set of the model (`--prompts` pairs, 3-shot "a + b = " vs "a @ b = ", right-padded),
each head's output at END taken from the counterfactual run into the reference run, and the relative change of
the answer logit at END as the metric. Each side computes it its own way:

- TransformerLens (TransformerBridge over the same weights): `patching.get_act_patch_attn_head_out_by_pos`, one
  call per prompt length (a patched index holds one position), the (layer, END, head) cells as index_df and a
  per-prompt metric (reduce="none");
- nnsight: one trace per head over the whole batch, the head's slice of the o_proj input set at every
  prompt's END;
- arithmech: `path_patch(..., "total")` on every head and MLP at once, and the `path` variant for scale.

Each peer is timed on `--heads` heads spread over the layers, after one untimed warm-up head, and scaled to every
component (heads and MLPs; a component costs it one forward pass, an MLP as much as a head). Its values are
checked against arithmech's on those heads: the largest |difference| is printed, and above `--atol` (1e-5) the
script says so and exits 1. A plain forward pass of the batch (the CausalLM on the right-padded batch) is timed
as the unit of "forwards per component"; arithmech's scans are also counted in plain forward passes
(tests/forward_cost.py), which no machine load changes, of the right-padded batch and of every prompt at its own
length (the cost model in docs/performance.md counts the latter).

TransformerLens and nnsight are not dependencies of arithmech: `pip install "arithmech[peers]"` (or
`pip install transformer-lens nnsight`). Without either, this script prints arithmech's counts, says so and
exits 0.

`--scaled` prints only arithmech's counts, on a model of the same shape with every width / 16 (see
benchmarks/answer_check.py) and a stratified sample of the same templates, unfiltered: in seconds on a CPU.

    python benchmarks/peers.py [--prompts 64] [--heads 12] [--model ID_OR_PATH] [--device cpu] [--atol 1e-5]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from answer_check import scaled  # noqa: E402
from record import record  # noqa: E402

from arithmech.data.reference_config import reference_pairs  # noqa: E402
from arithmech.data.reference_set import ReferenceSetConfig, build_reference_set  # noqa: E402
from arithmech.data.sampling import stratified_sample  # noqa: E402
from arithmech.data.tokens import tokenize_pairs  # noqa: E402
from arithmech.models.load import ModelConfig, ModelHandle, load_model  # noqa: E402
from arithmech.models.sites import Component, all_components  # noqa: E402
from arithmech.models.view import ModelView  # noqa: E402
from arithmech.patching.path import PatchingBatch, PatchResult, path_patch  # noqa: E402

from forward_cost import count_work, plain_forward_macs  # noqa: E402

PEERS = {"transformer_lens": "TransformerLens", "nnsight": "nnsight"}
INSTALL = 'pip install "arithmech[peers]"   (or: pip install transformer-lens nnsight)'
Patcher = Callable[[Component], torch.Tensor]
"""One head's per-prompt relative change of the answer logit [batch], computed by a peer."""


def installed_peers() -> list[str]:
    """The peers' modules that can be imported here."""
    return [name for name in PEERS if importlib.util.find_spec(name) is not None]


def relative_change(logits: torch.Tensor, batch: PatchingBatch, ref_logit: torch.Tensor) -> torch.Tensor:
    """[batch] from logits [batch, pos, d_vocab]: (logit of the answer at END - reference) / |reference|."""
    rows = torch.arange(len(batch))
    return ((logits[rows, batch.end, batch.answer_ids] - ref_logit) / ref_logit.abs()).detach().cpu()


def nnsight_patcher(model: Any, view: ModelView, batch: PatchingBatch, ref_logit: torch.Tensor) -> Patcher:
    """One trace per head: the head's d_head slice of o_proj's input at each prompt's END, from the counterfactual."""
    from nnsight import NNsight

    wrapped = NNsight(model)
    o_proj_path = view.spec.o_proj.split(".")
    rows, d_head = torch.arange(len(batch)), view.dims.d_head

    def o_proj(layer: int) -> Any:
        module = _envoy(wrapped, view, layer)
        for name in o_proj_path:
            module = getattr(module, name)
        return module

    sources: list[Any] = []  # [layer] the counterfactual run's o_proj inputs [batch, pos, head * d_head]
    with torch.no_grad(), wrapped.trace(input_ids=batch.cf_ids, attention_mask=batch.cf_mask):
        for layer in range(view.dims.n_layers):
            sources.append(o_proj(layer).input.save())

    def patch(head: Component) -> torch.Tensor:
        assert head.head is not None
        cols = slice(head.head * d_head, (head.head + 1) * d_head)
        source = sources[head.layer]
        with torch.no_grad(), wrapped.trace(input_ids=batch.ref_ids, attention_mask=batch.ref_mask):
            z = o_proj(head.layer).input
            z[rows, batch.end, cols] = source[rows, batch.end, cols]
            logits = wrapped.output.logits.save()
        return relative_change(logits, batch, ref_logit)

    return patch


def _envoy(wrapped: Any, view: ModelView, layer: int) -> Any:
    """The nnsight proxy of decoder layer `layer` (the spec's layer list path, e.g. model.layers)."""
    module = wrapped
    for name in view.spec.layers.split("."):
        module = getattr(module, name)
    return module[layer]


def transformer_lens_patcher(
    model: Any, tokenizer: Any, batch: PatchingBatch, ref_logit: torch.Tensor, device: str
) -> Patcher:
    """`get_act_patch_attn_head_out_by_pos` on each group of equal-length prompts, index_df = (layer, END, head)."""
    import pandas as pd
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers("arithmech-model", hf_model=model, tokenizer=tokenizer, device=device)
    groups = []
    for end in batch.end.unique().tolist():
        prompts = (batch.end == end).nonzero().flatten()
        width = int(end) + 1
        sub = PatchingBatch(batch.ref_ids[prompts, :width], batch.ref_mask[prompts, :width],
                            batch.cf_ids[prompts, :width], batch.cf_mask[prompts, :width],
                            batch.end[prompts], batch.answer_ids[prompts])  # fmt: skip
        with torch.no_grad():
            _, cache = bridge.run_with_cache(sub.cf_ids, names_filter=lambda name: name.endswith("hook_z"))
        groups.append((prompts, sub, cache))

    def patch(head: Component) -> torch.Tensor:
        out = torch.empty(len(batch))
        for prompts, sub, cache in groups:
            cells = pd.DataFrame([(head.layer, int(sub.end[0]), head.head)], columns=["layer", "pos", "head"])

            def metric(logits: torch.Tensor, sub: PatchingBatch = sub, prompts: torch.Tensor = prompts) -> torch.Tensor:
                return relative_change(logits, sub, ref_logit[prompts])

            result = patching.get_act_patch_attn_head_out_by_pos(
                bridge, sub.ref_ids, cache, metric, index_axis_names=None, index_df=cells, reduce="none"
            )
            out[prompts] = result.values.reshape(-1, len(prompts))[0].cpu()
        return out

    return patch


def time_peer(patch: Patcher, heads: Sequence[Component], fast: PatchResult) -> tuple[float, float]:
    """Seconds per head (after one warm-up head) and the largest |peer - arithmech total| on the heads."""
    patch(heads[0])
    worst, start = 0.0, time.perf_counter()
    for head in heads:
        values = patch(head)
        worst = max(worst, float((values - fast.per_prompt[fast.components.index(head)]).abs().max()))
    return (time.perf_counter() - start) / len(heads), worst


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--heads", type=int, default=12, help="heads each peer is timed on")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--atol", type=float, default=1e-5, help="largest |peer - arithmech| accepted")
    parser.add_argument("--scaled", action="store_true", help="count only, on the model's shape scaled down (below)")
    args = parser.parse_args(argv)
    peers = installed_peers()
    missing = [PEERS[name] for name in PEERS if name not in peers]
    if missing:
        print(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed and left out; {INSTALL}")

    torch.manual_seed(0)
    handle = load_model(ModelConfig(model=args.model, device=args.device))
    cfg = ReferenceSetConfig(max_prompts=args.prompts, n_per_template=max(16, args.prompts // 4))
    if args.scaled:  # the counts only: prompts of the same templates (not filtered), a model of the same shape
        return count_scaled(handle, cfg)
    t = build_reference_set(handle, cfg).tokenized
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    model, view, dims = handle.model, handle.view, handle.dims
    components = all_components(dims)
    heads = [c for c in components if c.head is not None]
    heads = heads[:: max(1, len(heads) // args.heads)][: args.heads]
    print(f"model {handle.source.get('model')}: {dims.n_layers} layers x {dims.n_heads} heads, {len(components)} "
          f"components; {len(batch)} prompt pairs, {int(t.ref_mask.sum()) / len(batch):.1f} tokens per prompt on "
          f"average ({batch.ref_ids.shape[1]} padded); peers timed on {len(heads)} heads")  # fmt: skip

    with torch.no_grad():
        model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask)  # warm-up
        start = time.perf_counter()
        logits = model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask).logits
        plain_s = time.perf_counter() - start
    ref_logit = logits[torch.arange(len(batch)), batch.end, batch.answer_ids]
    unit = plain_forward_macs(model, batch.ref_ids, batch.ref_mask)
    lengths = batch.ref_mask.sum(1)
    unpadded = sum(plain_forward_macs(model, batch.ref_ids[lengths == n, :n], batch.ref_mask[lengths == n, :n])
                   for n in lengths.unique().tolist())  # every prompt at its own length  # fmt: skip
    metrics: dict[str, float] = {"plain_forward_s": plain_s, "components": len(components)}
    fast: dict[str, PatchResult] = {}
    for variant in ("total", "path"):
        start = time.perf_counter()
        with count_work(model) as work:
            fast[variant] = path_patch(view, batch, variant, batch_size=len(batch))
        metrics[f"{variant}_s"] = time.perf_counter() - start
        metrics[f"{variant}_passes"] = work.macs / unit
        metrics[f"{variant}_passes_unpadded"] = work.macs / unpadded
    print(f"one plain forward pass of the batch: {plain_s:.2f} s")
    for variant in ("total", "path"):
        print(f"arithmech --variant {variant}, all {len(components)} components: {metrics[f'{variant}_s']:.2f} s, "
              f"{metrics[f'{variant}_s'] / plain_s / len(components):.3f} forwards per component (by time); "
              f"{metrics[f'{variant}_passes']:.2f} plain forward passes of the padded batch in all, "
              f"{metrics[f'{variant}_passes_unpadded']:.2f} of the unpadded prompts (counted)")  # fmt: skip
    if not peers:
        print(f"neither TransformerLens nor nnsight is installed, so there is nothing to compare with; {INSTALL}")
        return 0

    patchers = {
        "nnsight": lambda: nnsight_patcher(copy.deepcopy(model), view, batch, ref_logit),
        "transformer_lens": lambda: transformer_lens_patcher(
            copy.deepcopy(model), handle.tokenizer, batch, ref_logit, args.device
        ),
    }
    for name in peers:
        key = _key(name)
        per_head, worst = time_peer(patchers[name](), heads, fast["total"])
        metrics[f"{key}_s_per_head"], metrics[f"{key}_max_abs_diff"] = per_head, worst
        metrics[f"total_vs_{key}"] = per_head * len(components) / metrics["total_s"]
        print(f"{PEERS[name]}: {per_head:.2f} s per head = {per_head / plain_s:.2f} forwards; max |{PEERS[name]} - "
              f"arithmech| {worst:.1e} on {len(heads)} heads; arithmech total is {metrics[f'total_vs_{key}']:.1f}x "
              f"faster on all {len(components)} components")  # fmt: skip
    disagree = [PEERS[name] for name in peers if metrics[f"{_key(name)}_max_abs_diff"] > args.atol]
    if disagree:
        print(f"{' and '.join(disagree)} disagree with arithmech by more than {args.atol:g}: the timings compare "
              "different computations")  # fmt: skip
        return 1
    record("peers", args, metrics)
    return 0


def count_scaled(handle: ModelHandle, cfg: ReferenceSetConfig) -> int:
    """arithmech's scans counted on `answer_check.scaled`'s model (the model's shape, widths / 16) and a stratified
    sample of the generated prompts, unfiltered: the same templates, so the same lengths, in the same shares."""
    tokenized, _ = tokenize_pairs(handle.tokenizer, reference_pairs(cfg))
    tokenized = tokenized.take(stratified_sample(tokenized.unique_pairs(), cfg.max_prompts, cfg.seed))
    small, t = scaled(handle, tokenized)
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    lengths = batch.ref_mask.sum(1)
    unit = plain_forward_macs(small.model, batch.ref_ids, batch.ref_mask)
    unpadded = sum(plain_forward_macs(small.model, batch.ref_ids[lengths == n, :n], batch.ref_mask[lengths == n, :n])
                   for n in lengths.unique().tolist())  # fmt: skip
    average = float(lengths.float().mean())
    print(f"{len(batch)} prompt pairs of {average:.1f} tokens on average ({batch.ref_ids.shape[1]} padded), on "
          f"{handle.source.get('model')}'s shape with every width / 16 (counts only)")  # fmt: skip
    for variant in ("total", "path"):
        with count_work(small.model) as work:
            path_patch(small.view, batch, variant, batch_size=len(batch))
        print(f"arithmech --variant {variant}: {work.macs / unit:.2f} plain forward passes of the padded batch, "
              f"{work.macs / unpadded:.2f} of the unpadded prompts (counted)")  # fmt: skip
    return 0


def _key(name: str) -> str:
    """The metrics' short name of a peer module."""
    return "tl" if name == "transformer_lens" else "nnsight"


if __name__ == "__main__":
    sys.exit(main())
