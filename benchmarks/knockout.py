"""Batched knockout sweep vs one configuration per forward pass, on the same prompts, in one run.

The sweep (effect-rank and random-rank configurations for k = 1, 2, 4, ...) runs through the batched engine;
the loop runs each configuration as its own forward pass over the prompts with `ablate`, unembedding the END
rows only as the engine does (`reference_patching.end_logits`). Prints both times and the ratio, and checks the
two agree prompt by prompt: the same answers right (so the same accuracies) and the same answer probabilities
(max |batched - loop| over every configuration and prompt).

    python benchmarks/knockout.py [--prompts 32] [--max-k 16] [--n-random 3] [--from RUN_DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from record import record  # noqa: E402

from arithmech.data.reference_config import ReferenceSetConfig  # noqa: E402
from arithmech.data.reference_set import build_reference_set  # noqa: E402
from arithmech.knockout.ablation import ablate, ablation_sources, alignment_groups  # noqa: E402
from arithmech.knockout.batched import knockout_scores  # noqa: E402
from arithmech.knockout.sweep import k_values  # noqa: E402
from arithmech.models.load import ModelConfig, load_model  # noqa: E402
from arithmech.models.sites import all_components  # noqa: E402
from arithmech.patching.path import PatchingBatch  # noqa: E402

from reference_patching import end_logits  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-k", type=int, default=16)
    parser.add_argument("--n-random", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="rows per batched forward pass")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    handle = load_model(ModelConfig(model=args.model, device=args.device))
    t = build_reference_set(handle, ReferenceSetConfig(max_prompts=args.prompts)).tokenized
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    groups = alignment_groups([p.template_id for p in t.pairs], t.end + 1)
    sources = ablation_sources(handle.view, batch, "mean", groups)
    heads = [c for c in all_components(handle.dims) if c.head is not None]
    rng = random.Random(0)
    configs = [[]] + [rng.sample(heads, k) for k in k_values(args.max_k) for _ in range(1 + args.n_random)]
    print(
        f"{len(configs)} configurations x {len(batch)} prompts "
        f"({int(t.ref_mask.sum()) / len(batch):.1f} tokens per prompt on average)"
    )

    start = time.perf_counter()
    batched = knockout_scores(handle.view, batch, sources, configs, batch_size=args.batch_size)
    batched_s = time.perf_counter() - start

    start = time.perf_counter()
    loop_correct, loop_prob = [], []
    rows = torch.arange(len(batch))
    for config in configs:
        with torch.no_grad(), ablate(handle.view, config, sources):
            logits = end_logits(handle.model, batch.ref_ids, batch.ref_mask, batch.end).float().cpu()  # [batch, vocab]
        loop_correct.append(logits.argmax(-1) == batch.answer_ids)
        loop_prob.append(logits.softmax(-1)[rows, batch.answer_ids])
    loop_s = time.perf_counter() - start

    correct, prob = torch.stack(loop_correct), torch.stack(loop_prob)  # [config, prompt]
    agree = bool((batched.correct.cpu() == correct).all())  # prompt by prompt, so the accuracies too
    prob_diff = float((batched.answer_prob.float().cpu() - prob).abs().max())
    print(f"batched sweep: {batched_s:.1f} s; one configuration per pass: {loop_s:.1f} s")
    print(f"answers right on the same prompts: {agree}; max |answer probability difference|: {prob_diff:.1e}")
    print(f"speedup: {loop_s / batched_s:.2f}x")
    record("knockout", args, {
        "speedup": loop_s / batched_s, "batched_s": batched_s, "loop_s": loop_s, "accuracies_agree": agree,
        "max_prob_diff": prob_diff,
    })  # fmt: skip


if __name__ == "__main__":
    main()
