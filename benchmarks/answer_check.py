"""The reference set's answer check (which generated prompts the model answers), counted in plain forward passes.

identify checks every generated prompt (192 by default) before it patches a few of them. The check runs each
prompt with its whole answer once (`data/reference_set.answer_check`): chunks of about one length, the tokens a
chunk shares at the start run once, only the read positions unembedded. This script counts its work
(tests/forward_cost.py: multiply-accumulates of every linear layer, which no machine load changes) in plain
forward passes of the generated set, one row per prompt, right-padded, logits of every position (the unit of
`benchmarks/peers.py`), and per unpadded prompt; and the per-row check it replaced (`predict_at_end` on every
row in chunks of `--batch-size`, as the engine did before) on the same prompts. It also says how many prompts
the end-of-number rule (the next top token is no digit) drops.

With `--scaled` the counts are taken on a random-init model of the model's shape with every width divided by 16
(linear-layer work scales as width^2 throughout, so counts in forward passes are the model's own; see
tests/unit/patching/test_cost.py), on the same token positions: seconds instead of many minutes on a CPU. Which
prompts it keeps then means nothing, only the counts.

    python benchmarks/answer_check.py [--answer-digits] [--scaled] [--batch-size 16] [--model ID_OR_PATH]
"""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from record import record  # noqa: E402

from arithmech.data.reference_config import ReferenceSetConfig, reference_pairs  # noqa: E402
from arithmech.data.reference_set import answer_check, answer_sequences  # noqa: E402
from arithmech.data.tokens import TokenizedPairs, tokenize_pairs  # noqa: E402
from arithmech.models.load import ModelConfig, ModelHandle, load_model  # noqa: E402
from arithmech.models.predictions import predict_at_end  # noqa: E402
from arithmech.models.view import ModelView  # noqa: E402

from forward_cost import count_work, plain_forward_macs  # noqa: E402


def scaled(handle: ModelHandle, tokenized: TokenizedPairs) -> tuple[ModelHandle, TokenizedPairs]:
    """A random-init model of the handle's shape, every width / 16, and the prompts' tokens renumbered into its
    vocabulary (equal tokens stay equal, different ones different)."""
    config = copy.deepcopy(handle.model.config)
    for name in ("hidden_size", "intermediate_size", "vocab_size", "head_dim"):
        if getattr(config, name, None):
            setattr(config, name, max(1, getattr(config, name) // 16))
    config.use_cache = False
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    used = torch.cat([tokenized.ref_ids.flatten(), tokenized.cf_ids.flatten(), tokenized.answer_ids]).unique()
    if len(used) > config.vocab_size:
        raise SystemExit(f"the prompts use {len(used)} tokens, more than the scaled vocabulary's {config.vocab_size}")
    number = torch.zeros(int(used.max()) + 1, dtype=torch.long)
    number[used] = torch.arange(len(used))
    renumbered = replace(tokenized, ref_ids=number[tokenized.ref_ids], cf_ids=number[tokenized.cf_ids],
                         answer_ids=number[tokenized.answer_ids], pad_id=int(number[tokenized.pad_id]))  # fmt: skip
    view = ModelView(model, handle.view.spec)
    return ModelHandle(model, handle.tokenizer, view, {**handle.source, "scaled": 16}), renumbered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answer-digits", action="store_true", help="two-digit sums (operands 10-49), every digit")
    parser.add_argument("--batch-size", type=int, default=ReferenceSetConfig().batch_size)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--scaled", action="store_true", help="count on the model's shape scaled down (see above)")
    args = parser.parse_args()

    handle = load_model(ModelConfig(model=args.model, device=args.device))
    operands = {"operand_min": 10, "operand_max": 49} if args.answer_digits else {}
    cfg = ReferenceSetConfig(answer_digits=args.answer_digits, batch_size=args.batch_size, **operands)
    tokenized, _ = tokenize_pairs(handle.tokenizer, reference_pairs(cfg), answer_digits=cfg.answer_digits)
    if args.scaled:
        handle, tokenized = scaled(handle, tokenized)
    first = torch.ones_like(tokenized.pair_index, dtype=torch.bool)
    first[1:] = tokenized.pair_index[1:] != tokenized.pair_index[:-1]
    ids, mask = tokenized.ref_ids[first], tokenized.ref_mask[first]  # [pair, pos]: each prompt once
    width = int(mask.sum(1).max())
    padded = plain_forward_macs(handle.model, ids[:, :width], mask[:, :width])
    unpadded = 0
    for length in mask.sum(1).unique().tolist():
        same = mask.sum(1) == length
        unpadded += plain_forward_macs(handle.model, ids[same, :length], mask[same, :length])

    with count_work(handle.model) as new:
        kept = answer_check(handle, tokenized, cfg.batch_size)
    with count_work(handle.model) as old:
        before = predict_at_end(handle.view, tokenized.ref_ids, tokenized.ref_mask, tokenized.end,
                                tokenized.answer_ids, cfg.batch_size)  # fmt: skip
    wrong = torch.zeros(tokenized.n_pairs, dtype=torch.long).index_add_(
        0, tokenized.pair_index, (~before.correct).long()
    )
    tokens_right = wrong == 0  # [pair] the per-row rule: every answer token the top one
    _, reads, _ = answer_sequences(tokenized)
    metrics = {
        "prompts": tokenized.n_pairs,
        "rows": len(tokenized.end),
        "check_passes": new.macs / padded,
        "check_passes_unpadded": new.macs / unpadded,
        "per_row_check_passes": old.macs / padded,
        "kept": int(kept.sum()),
        "kept_by_tokens_only": int(tokens_right.sum()),
        "kept_subset": bool((tokens_right | ~kept).all()),  # the end rule only ever drops prompts
    }
    print(f"model {handle.source.get('model')}; {tokenized.n_pairs} generated prompts, {len(tokenized.end)} scored "
          f"rows, {float(mask.sum(1).float().mean()):.1f} tokens per prompt on average ({width} padded), "
          f"{sum(len(r) for r in reads)} positions read")  # fmt: skip
    print(f"answer check: {metrics['check_passes']:.3f} plain forward passes of the generated set "
          f"({metrics['check_passes_unpadded']:.3f} of the unpadded prompts); the per-row check it replaced: "
          f"{metrics['per_row_check_passes']:.3f}")  # fmt: skip
    print(f"kept {metrics['kept']} prompts; every answer token right: {metrics['kept_by_tokens_only']} "
          f"(the end-of-number rule drops {metrics['kept_by_tokens_only'] - metrics['kept']})")
    record("answer_check", args, metrics)


if __name__ == "__main__":
    main()
