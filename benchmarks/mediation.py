"""Batched causal mediation vs one intervention per forward pass, on the default model, in one run.

The batched engine (`mediation_effects`) computes the IE of the MLP and attention output of every layer at every
position of a few addition Q/A pairs. The loop runs each intervention as its own full forward pass of the base
prompt with one hook (as the original implementations do) and unembeds its last position only
(`logits_to_keep=1`), as the engine does; it is timed on a random sample of interventions and scaled to the whole
set (its base and alternative runs, once per pair, are not counted). Prints both times, the ratio, and the
largest IE difference on the sample.

Two counts for the loop: the interventions the engine runs (positions from the first token where base and
alternative differ; before it the IE is exactly 0), and every position of the prompt (what a plain loop runs).

    python benchmarks/mediation.py [--pairs 8] [--sample 48] [--few-shot 3] [--max-rows 256]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from record import record

from arithmech.data.mediation_generate import generate_mediation_pairs
from arithmech.data.mediation_prompts import MediationDataConfig
from arithmech.data.mediation_tokens import tokenize_mediation_pairs
from arithmech.models.hooks import first_tensor, hooks
from arithmech.models.load import ModelConfig, load_model
from arithmech.patching.mediation import indirect_effect, mediation_effects


def last_probs(handle, ids: torch.Tensor) -> torch.Tensor:
    """Next-token probabilities [d_vocab] after one unpadded prompt [pos], unembedding its last position only."""
    logits = handle.model(input_ids=ids[None].to(handle.device), logits_to_keep=1).logits  # [1, 1, d_vocab]
    return logits[0, -1].float().softmax(-1)


def capture(handle, ids: torch.Tensor, modules: list) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """END probabilities [d_vocab] of one prompt and each module's output [pos, d_model]."""
    saved: list = [None] * len(modules)

    def save(s: int):
        return lambda _m, _a, out: saved.__setitem__(s, first_tensor(out)[0].clone())

    with torch.no_grad(), hooks(post=[(m, save(s)) for s, m in enumerate(modules)]):
        probs = last_probs(handle, ids)
    return probs, saved


def one_intervention(handle, item, base: torch.Tensor, module, pos: int, value: torch.Tensor) -> float:
    """IE of one (component, layer, position) intervention: one full forward pass of the base prompt."""

    def setter(_m, _a, output):
        out = first_tensor(output).clone()
        out[0, pos] = value
        return (out, *output[1:]) if isinstance(output, tuple) else out

    with torch.no_grad(), hooks(post=[(module, setter)]):
        star = last_probs(handle, item.base_ids)
    r, r2 = item.result_id, item.alt_result_id
    return float(indirect_effect(base[r], base[r2], star[r], star[r2]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--sample", type=int, default=48, help="interventions timed one per forward pass")
    parser.add_argument("--few-shot", type=int, default=3)
    parser.add_argument("--max-rows", type=int, default=256)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    handle = load_model(ModelConfig(model=args.model, device=args.device))
    cfg = MediationDataConfig(
        tasks=("addition",), formats=("qa",), n_per_template=(args.pairs + 1) // 2, few_shot=args.few_shot
    )
    items, _ = tokenize_mediation_pairs(handle.tokenizer, generate_mediation_pairs(cfg))
    items = items[: args.pairs]
    n_layers = handle.dims.n_layers
    first = [int((i.base_ids != i.alt_ids).nonzero()[0]) for i in items]
    run = [(k, c, layer, p) for k, i in enumerate(items) for c in range(2) for layer in range(n_layers)
           for p in range(first[k], len(i.base_ids))]  # fmt: skip
    every = sum(2 * n_layers * len(i.base_ids) for i in items)
    print(f"{len(items)} pairs, {sum(len(i.base_ids) for i in items) / len(items):.1f} tokens on average; "
          f"{len(run)} interventions run ({every} at every position)")  # fmt: skip

    start = time.perf_counter()
    result = mediation_effects(handle.view, items, max_rows=args.max_rows)
    batched_s = time.perf_counter() - start

    # the loop's per-pair work (base probabilities, alternative values of every site) is done once, untimed
    modules = [handle.view.mlp(layer) for layer in range(n_layers)] + [
        handle.view.o_proj(layer) for layer in range(n_layers)
    ]
    cached = [(capture(handle, i.base_ids, [])[0], capture(handle, i.alt_ids, modules)[1]) for i in items]
    sample = random.Random(0).sample(run, min(args.sample, len(run)))
    diffs, scaled_diffs = [], []
    start = time.perf_counter()
    for k, c, layer, p in sample:
        base, alt = cached[k]
        ie = one_intervention(handle, items[k], base, modules[c * n_layers + layer], p, alt[c * n_layers + layer][p])
        diffs.append(abs(ie - float(result.ie[k, c, layer, p])))
        # IE is a ratio that explodes when P(r') is tiny: its float error is relative to |IE| above 1
        scaled_diffs.append(diffs[-1] / max(1.0, abs(ie)))
    per_intervention = (time.perf_counter() - start) / len(sample)
    loop_s, loop_every_s = per_intervention * len(run), per_intervention * every

    print(f"batched: {batched_s:.1f} s; one intervention per pass: {per_intervention:.3f} s each, "
          f"{loop_s:.1f} s for the same interventions, {loop_every_s:.1f} s at every position")  # fmt: skip
    print(f"largest |IE difference| on the {len(sample)} sampled interventions: {max(diffs):.2e}")
    print(f"ratio (one per pass / batched), same interventions: {loop_s / batched_s:.1f}x; "
          f"every position: {loop_every_s / batched_s:.1f}x")
    record("mediation", args, {
        "speedup": loop_s / batched_s, "batched_s": batched_s, "loop_s": loop_s,
        "max_scaled_ie_diff": max(scaled_diffs),
    })  # fmt: skip


if __name__ == "__main__":
    main()
