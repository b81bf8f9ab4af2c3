"""Activation patching of every head's END output: arithmech vs TransformerLens and nnsight, same prompts, one run.

The work: a reference set of the model (`--prompts` pairs, "a + b = " vs "a @ b = " after solved examples,
right-padded), each head's output at END taken from the counterfactual run into the reference run, and the
relative change of the answer logit at END as the metric. Each side computes it its own way:

- TransformerLens (TransformerBridge over the same weights): `patching.get_act_patch_attn_head_out_by_pos`, one
  call per prompt length (a patched index holds one position), the (layer, END, head) cells as index_df and a
  per-prompt metric (reduce="none");
- nnsight: one trace per head over the whole batch, the head's slice of the o_proj input set at every
  prompt's END;
- arithmech: `path_patch(..., "total")` on every head and MLP at once, and the `path` variant for scale.

The comparison is algorithmic: arithmech recomputes each component's last token on the cached reference prompt,
the peers run one full forward pass per component. It runs on two prompt sets (`--sets`,
`suite.PEER_PROMPT_SETS`): short (2 solved examples, about 30 tokens a prompt) and the default reference set (3,
about 45). On each, every side runs once untimed (a warm-up; the peers' on one head), then `--repeats`
interleaved repetitions: arithmech, then each peer (their order rotated each repetition) on `--heads` heads
spread over the layers, scaled to every component (heads and MLPs; a component costs it one forward pass, an MLP
as much as a head). Each repetition gives a ratio per peer, against arithmech's time in the same repetition; the
script records their median, min and max, since single timings on a shared machine reorder the peers from run
to run. Each peer's values are checked against arithmech's on the heads it times: the largest |difference| is
printed, and above `--atol` (1e-5) the script says so and exits 1.

Work is counted (tests/forward_cost.py, which no machine load changes) in forward passes of the prompts: each
prompt at its own length, logits of its last token only, the unit of one forward pass per component. arithmech's
scans are also counted in the padded unit (the right-padded batch with logits at every position), and each
peer's warm-up head in the first. A forward pass of the prompts is timed too, for "forwards per component".

TransformerLens and nnsight are not dependencies of arithmech: `pip install "arithmech[peers]"` (or
`pip install transformer-lens nnsight`). Without either, this script prints arithmech's counts, says so and
exits 0.

`--scaled` prints only arithmech's counts, on a model of the same shape with every width / 16 (see
benchmarks/answer_check.py) and a stratified sample of the same templates, unfiltered: in seconds on a CPU.

    python benchmarks/peers.py [--prompts 64] [--heads 12] [--repeats 3] [--sets short,default] [--model ID]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from answer_check import scaled  # noqa: E402
from record import record  # noqa: E402
from suite import PEER_PROMPT_SETS  # noqa: E402

from arithmech.data.reference_config import reference_pairs  # noqa: E402
from arithmech.data.reference_set import ReferenceSetConfig, build_reference_set  # noqa: E402
from arithmech.data.sampling import stratified_sample  # noqa: E402
from arithmech.data.tokens import tokenize_pairs  # noqa: E402
from arithmech.models.load import ModelConfig, ModelHandle, load_model  # noqa: E402
from arithmech.models.sites import Component, all_components  # noqa: E402
from arithmech.models.view import ModelView  # noqa: E402
from arithmech.patching.path import PatchingBatch, PatchResult, path_patch  # noqa: E402

from forward_cost import count_work, plain_forward_macs, prompt_forward_macs  # noqa: E402
from reference_patching import end_logits  # noqa: E402

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
    """Seconds per head and the largest |peer - arithmech total| on the heads."""
    worst, start = 0.0, time.perf_counter()
    for head in heads:
        values = patch(head)
        worst = max(worst, float((values - fast.per_prompt[fast.components.index(head)]).abs().max()))
    return (time.perf_counter() - start) / len(heads), worst


def prompt_forward(model: Any, batch: PatchingBatch) -> None:
    """One forward pass of the prompts, the unit of the counts: each length's prompts together, unpadded, the
    vocabulary projection of END only (`reference_patching.end_logits`)."""
    lengths = batch.ref_mask.sum(1)
    for n in lengths.unique().tolist():
        rows = lengths == n
        end_logits(model, batch.ref_ids[rows, :n], batch.ref_mask[rows, :n], batch.end[rows])


def spread(name: str, values: Sequence[float]) -> dict[str, float]:
    """`name`: the median of `values`; `name_min`, `name_max`."""
    return {name: statistics.median(values), f"{name}_min": min(values), f"{name}_max": max(values)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--heads", type=int, default=12, help="heads each peer is timed on, each repetition")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions of every side")
    names = ", ".join(PEER_PROMPT_SETS)
    parser.add_argument("--sets", default=",".join(PEER_PROMPT_SETS), help=f"prompt sets, of {names}")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--atol", type=float, default=1e-5, help="largest |peer - arithmech| accepted")
    parser.add_argument("--scaled", action="store_true", help="count only, on the model's shape scaled down (below)")
    args = parser.parse_args(argv)
    sets = [name.strip() for name in args.sets.split(",") if name.strip()]
    if not sets or any(name not in PEER_PROMPT_SETS for name in sets):
        parser.error(f"--sets takes names of {names} (got {args.sets!r})")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    peers = installed_peers()
    missing = [PEERS[name] for name in PEERS if name not in peers]
    if missing:
        print(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed and left out; {INSTALL}")

    torch.manual_seed(0)
    handle = load_model(ModelConfig(model=args.model, device=args.device))
    metrics: dict[str, float] = {"components": len(all_components(handle.dims)), "repeats": args.repeats}
    for name in sets:
        cfg = ReferenceSetConfig(max_prompts=args.prompts, n_per_template=max(16, args.prompts // 4),
                                 few_shot=PEER_PROMPT_SETS[name])  # fmt: skip
        if args.scaled:  # the counts only: prompts of the same templates (not filtered), a model of the same shape
            count_scaled(handle, cfg, name)
            continue
        t = build_reference_set(handle, cfg).tokenized
        batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
        measured = side_by_side(handle, batch, name, peers, args)
        metrics.update({f"{name}_{key}": value for key, value in measured.items()})
    if args.scaled:
        return 0
    if not peers:
        print(f"neither TransformerLens nor nnsight is installed, so there is nothing to compare with; {INSTALL}")
        return 0
    disagree = sorted({PEERS[peer] for peer in peers for name in sets
                       if metrics[f"{name}_{_key(peer)}_max_abs_diff"] > args.atol})  # fmt: skip
    if disagree:
        print(f"{' and '.join(disagree)} disagree with arithmech by more than {args.atol:g}: the timings compare "
              "different computations")  # fmt: skip
        return 1
    record("peers", args, metrics)
    return 0


def side_by_side(
    handle: ModelHandle, batch: PatchingBatch, name: str, peers: Sequence[str], args: argparse.Namespace
) -> dict[str, float]:
    """One prompt set: arithmech's counts, then the interleaved repetitions; the metrics, without the set's name."""
    model, view, dims = handle.model, handle.view, handle.dims
    components = all_components(dims)
    heads = [c for c in components if c.head is not None]
    heads = heads[:: max(1, len(heads) // args.heads)][: args.heads]
    tokens = int(batch.ref_mask.sum()) / len(batch)
    print(f"\n{name} prompts, model {handle.source.get('model')}: {dims.n_layers} layers x {dims.n_heads} heads, "
          f"{len(components)} components; {len(batch)} prompt pairs, {tokens:.1f} tokens per prompt on average "
          f"({batch.ref_ids.shape[1]} padded); peers timed on {len(heads)} heads, {args.repeats} times")  # fmt: skip
    m: dict[str, float] = {"prompts": len(batch), "tokens": tokens, "padded_width": batch.ref_ids.shape[1]}
    with torch.no_grad():
        logits = model(input_ids=batch.ref_ids, attention_mask=batch.ref_mask).logits  # [batch, pos, d_vocab]
        ref_logit = logits[torch.arange(len(batch)), batch.end, batch.answer_ids]
        del logits
        prompt_forward(model, batch)  # warm-up
        start = time.perf_counter()
        prompt_forward(model, batch)
        m["prompt_forward_s"] = time.perf_counter() - start
    unit = prompt_forward_macs(model, batch.ref_ids, batch.ref_mask)
    padded = plain_forward_macs(model, batch.ref_ids, batch.ref_mask)
    fast: dict[str, PatchResult] = {}
    for variant in ("total", "path"):  # counted; total's run is also its warm-up, path's its one timing
        start = time.perf_counter()
        with count_work(model) as work:
            fast[variant] = path_patch(view, batch, variant, batch_size=len(batch))
        m[f"{variant}_s"] = time.perf_counter() - start
        m[f"{variant}_prompt_passes"], m[f"{variant}_passes"] = work.macs / unit, work.macs / padded
        print(f"arithmech --variant {variant}: {m[f'{variant}_prompt_passes']:.2f} forward passes of the prompts "
              f"(each at its own length, last-token logits), {m[f'{variant}_passes']:.2f} of the right-padded batch "
              "with logits at every position (counted)")  # fmt: skip
    print(f"arithmech --variant path, all {len(components)} components: {m['path_s']:.2f} s (one timing)")
    if not peers:
        return m

    patchers = {}
    for peer in peers:
        copied = copy.deepcopy(model)
        if peer == "nnsight":
            patchers[peer] = nnsight_patcher(copied, view, batch, ref_logit)
        else:
            patchers[peer] = transformer_lens_patcher(copied, handle.tokenizer, batch, ref_logit, args.device)
        with count_work(copied) as work:
            patchers[peer](heads[0])  # warm-up, counted
        if work.macs:  # the peer ran the copy's own linear modules
            m[f"{_key(peer)}_prompt_passes_per_head"] = work.macs / unit
    total_s: list[float] = []
    per_head: dict[str, list[float]] = {peer: [] for peer in peers}
    worst = dict.fromkeys(peers, 0.0)
    for rep in range(args.repeats):
        start = time.perf_counter()
        path_patch(view, batch, "total", batch_size=len(batch))
        total_s.append(time.perf_counter() - start)
        line = [f"arithmech total {total_s[-1]:.2f} s"]
        for peer in peers[rep % len(peers) :] + peers[: rep % len(peers)]:  # the peers' order rotates
            seconds, difference = time_peer(patchers[peer], heads, fast["total"])
            per_head[peer].append(seconds)
            worst[peer] = max(worst[peer], difference)
            line.append(f"{PEERS[peer]} {seconds:.2f} s per head ({seconds * len(components) / total_s[-1]:.1f}x)")
        print(f"repetition {rep + 1}: " + ", ".join(line))
    m.update(spread("total_s", total_s))
    for peer in peers:
        key = _key(peer)
        ratios = [s * len(components) / t for s, t in zip(per_head[peer], total_s, strict=True)]
        m.update({**spread(f"{key}_s_per_head", per_head[peer]), **spread(f"total_vs_{key}", ratios)})
        m[f"{key}_max_abs_diff"] = worst[peer]
        counted = m.get(f"{key}_prompt_passes_per_head")
        print(f"{PEERS[peer]}: {m[f'{key}_s_per_head']:.2f} s per head (median) = "
              f"{m[f'{key}_s_per_head'] / m['prompt_forward_s']:.2f} forward passes of the prompts by time"
              + (f", {counted:.2f} counted" if counted else "") + f"; max |{PEERS[peer]} - arithmech| "
              f"{worst[peer]:.1e}; arithmech total is {m[f'total_vs_{key}']:.1f}x faster on all {len(components)} "
              f"components (median of {args.repeats}; {min(ratios):.1f}-{max(ratios):.1f}x)")  # fmt: skip
    return m


def count_scaled(handle: ModelHandle, cfg: ReferenceSetConfig, name: str) -> None:
    """arithmech's scans counted on `answer_check.scaled`'s model (the model's shape, widths / 16) and a stratified
    sample of the generated prompts, unfiltered: the same templates, so the same lengths, in the same shares."""
    tokenized, _ = tokenize_pairs(handle.tokenizer, reference_pairs(cfg))
    tokenized = tokenized.take(stratified_sample(tokenized.unique_pairs(), cfg.max_prompts, cfg.seed))
    small, t = scaled(handle, tokenized)
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    unit = prompt_forward_macs(small.model, batch.ref_ids, batch.ref_mask)
    padded = plain_forward_macs(small.model, batch.ref_ids, batch.ref_mask)
    average = float(batch.ref_mask.sum(1).float().mean())
    print(f"{name} prompts: {len(batch)} prompt pairs of {average:.1f} tokens on average ({batch.ref_ids.shape[1]} "
          f"padded), on {handle.source.get('model')}'s shape with every width / 16 (counts only)")  # fmt: skip
    for variant in ("total", "path"):
        with count_work(small.model) as work:
            path_patch(small.view, batch, variant, batch_size=len(batch))
        print(f"arithmech --variant {variant}: {work.macs / unit:.2f} forward passes of the prompts (each at its own "
              f"length, last-token logits), {work.macs / padded:.2f} of the right-padded batch with logits at every "
              "position (counted)")  # fmt: skip


def _key(name: str) -> str:
    """The metrics' short name of a peer module."""
    return "tl" if name == "transformer_lens" else "nnsight"


if __name__ == "__main__":
    sys.exit(main())
