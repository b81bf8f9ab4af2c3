"""Per-digit path patching (`identify --answer-digits`) vs the one-forward-pass-per-component loop, in one run.

Two-digit addition (operands 10-49, answers 20-98: two tokens on digit-splitting tokenizers), each answer token
scored on the prompt plus the answer's earlier tokens (teacher forcing): both sides patch the same rows, one
per (prompt, answer token), in the same chunks of about one length. The loop is timed on a sample of components
spread over the layers and scaled to all of them; the fast engine on all components. Prints the ratios, and
each side's work counted in forward passes of the rows (each at its own length, last-token logits), the
engine's also in the padded unit (tests/forward_cost.py; `path_patching.py` says more).

    python benchmarks/answer_digits.py [--prompts 32] [--sample 12] [--model ID_OR_PATH] [--device cpu]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from path_patching import arguments, measure, print_variant  # noqa: E402
from record import record  # noqa: E402

from arithmech.data.places import place_name  # noqa: E402
from arithmech.data.reference_config import ReferenceSetConfig  # noqa: E402
from arithmech.data.reference_set import build_reference_set  # noqa: E402
from arithmech.models.load import ModelConfig, load_model  # noqa: E402
from arithmech.patching.path import PatchingBatch  # noqa: E402


def main() -> None:
    args = arguments(__doc__, prompts=32).parse_args()

    torch.manual_seed(0)
    handle = load_model(ModelConfig(model=args.model, device=args.device, dtype=args.dtype))
    cfg = ReferenceSetConfig(max_prompts=args.prompts, n_per_template=max(16, args.prompts), operand_min=10,
                             operand_max=49, answer_digits=True)  # fmt: skip
    t = build_reference_set(handle, cfg).tokenized
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    places = [place_name(p) for p in sorted(set(t.answer_place.tolist()))]
    print(f"model {handle.source.get('model')}: {handle.dims.n_layers} layers x {handle.dims.n_heads} heads; "
          f"{t.n_pairs} prompt pairs, {len(batch)} rows (answer places {', '.join(places)}), "
          f"{int(t.ref_mask.sum()) / len(batch):.1f} tokens per row on average")  # fmt: skip

    measured = measure(handle, batch, args.sample, args.batch_size)
    for variant in ("path", "total"):
        print_variant(variant, measured, "the rows")
    record("answer_digits", args, {**measured.metrics(), "rows": len(batch), "answer_tokens": len(places)})


if __name__ == "__main__":
    main()
