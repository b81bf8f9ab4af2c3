"""Fast path patching vs the usual one-forward-pass-per-component loop, on the same prompts, in one run.

Both variants users compare: path (attention frozen, the paper's) and total (activation patching at END, what
TransformerLens and nnsight compute). The loop is timed on a sample of components spread over the layers and
scaled to all of them (it costs the same for every component); the fast engine is timed on all components. Both
sides run the same chunks of about one length (`patching.path.length_chunks`, `--batch-size` prompts at most),
so the ratio is not padding, and both unembed END rows only. Prints the ratios, and each side's work counted in
forward passes of the prompts (tests/forward_cost.py `prompt_forward_macs`: every prompt at its own length,
logits of its last token; deterministic, whatever the machine's load), where the loop costs about one per
component; and the engine's in the padded unit too (the right-padded batch, logits at every position).

    python benchmarks/path_patching.py [--prompts 64] [--sample 12] [--model ID_OR_PATH] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from record import record  # noqa: E402

from arithmech.data.reference_config import ReferenceSetConfig  # noqa: E402
from arithmech.data.reference_set import build_reference_set  # noqa: E402
from arithmech.models.load import ModelConfig, load_model  # noqa: E402
from arithmech.models.sites import all_components  # noqa: E402
from arithmech.patching.path import PatchingBatch, length_chunks, path_patch  # noqa: E402

from forward_cost import count_work, plain_forward_macs, prompt_forward_macs  # noqa: E402
from reference_patching import ReferencePatcher  # noqa: E402


def arguments(doc: str, prompts: int) -> argparse.ArgumentParser:
    """The options of a fast-engine-vs-loop benchmark (this one and benchmarks/answer_digits.py)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=prompts, help="prompt pairs")
    parser.add_argument("--sample", type=int, default=12, help="components timed in the loop")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=64)
    return parser


def main() -> None:
    args = arguments(__doc__, prompts=64).parse_args()

    torch.manual_seed(0)
    handle = load_model(ModelConfig(model=args.model, device=args.device, dtype=args.dtype))
    cfg = ReferenceSetConfig(max_prompts=args.prompts, n_per_template=max(16, args.prompts // 4))
    t = build_reference_set(handle, cfg).tokenized
    batch = PatchingBatch(t.ref_ids, t.ref_mask, t.cf_ids, t.cf_mask, t.end, t.answer_ids)
    print(f"model {handle.source.get('model')}: {handle.dims.n_layers} layers x {handle.dims.n_heads} heads; "
          f"{len(batch)} prompt pairs, {int(t.ref_mask.sum()) / len(batch):.1f} tokens per prompt on average")

    measured = measure(handle, batch, args.sample, args.batch_size)
    for variant in ("path", "total"):
        print_variant(variant, measured, "the prompts")
    record("path_patching", args, measured.metrics())


@dataclass(frozen=True)
class Measured:
    """Per variant (path, total): the fast engine's seconds on all components and its work, the loop's seconds
    scaled to all components and its largest difference to the engine; the loop's work per component."""

    fast_s: dict[str, float]
    prompt_passes: dict[str, float]
    """The engine's work in forward passes of the prompts (`prompt_forward_macs`)."""
    padded_passes: dict[str, float]
    """The same work in plain forward passes of the right-padded batch (`plain_forward_macs`)."""
    loop_s: dict[str, float]
    worst: dict[str, float]
    loop_prompt_passes: float
    """The loop's work per component, in forward passes of the prompts: 1 but for the padding within chunks."""
    components: int
    n_sample: int

    def metrics(self) -> dict[str, float]:
        """What `record` keeps."""
        return {
            "speedup": self.loop_s["path"] / self.fast_s["path"], "fast_s": self.fast_s["path"],
            "loop_s": self.loop_s["path"], "max_abs_diff": self.worst["path"],
            "path_passes": self.padded_passes["path"], "path_prompt_passes": self.prompt_passes["path"],
            "total_speedup": self.loop_s["total"] / self.fast_s["total"], "total_s": self.fast_s["total"],
            "total_loop_s": self.loop_s["total"], "total_max_abs_diff": self.worst["total"],
            "total_passes": self.padded_passes["total"], "total_prompt_passes": self.prompt_passes["total"],
            "loop_prompt_passes": self.loop_prompt_passes, "components": self.components,
        }  # fmt: skip


def measure(handle: Any, batch: PatchingBatch, n_sample: int, batch_size: int) -> Measured:
    """Time and count the fast engine on every component and the loop on `n_sample` of them, both in the chunks
    of `length_chunks(batch, batch_size)`."""
    components = all_components(handle.dims)

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    unit = prompt_forward_macs(handle.model, batch.ref_ids, batch.ref_mask)
    padded = plain_forward_macs(handle.model, batch.ref_ids, batch.ref_mask)
    fast, fast_s, passes = {}, {}, {}
    for variant in ("path", "total"):
        sync()
        start = time.perf_counter()
        with count_work(handle.model) as work:
            fast[variant] = path_patch(handle.view, batch, variant, batch_size=batch_size)
        sync()
        fast_s[variant] = time.perf_counter() - start
        passes[variant] = work.macs

    step = max(1, len(components) // n_sample)
    sample = components[::step][:n_sample]
    chunks = length_chunks(batch, batch_size)
    order = torch.cat(chunks).argsort()  # each prompt's place among the chunks' prompts
    references = [ReferencePatcher(handle.view, batch.select(c)) for c in chunks]  # caching passes not counted
    loop_s, worst, loop_macs = {}, {}, 0
    for variant in ("path", "total"):
        sync()
        start = time.perf_counter()
        worst[variant] = 0.0
        with count_work(handle.model) as work:
            for component in sample:
                effect = torch.cat([reference.effect(component, variant) for reference in references])[order]
                index = components.index(component)
                worst[variant] = max(worst[variant], float((effect - fast[variant].per_prompt[index]).abs().max()))
        sync()
        loop_s[variant] = (time.perf_counter() - start) / len(sample) * len(components)
        loop_macs += work.macs
    return Measured(
        fast_s=fast_s, prompt_passes={v: m / unit for v, m in passes.items()},
        padded_passes={v: m / padded for v, m in passes.items()}, loop_s=loop_s, worst=worst,
        loop_prompt_passes=loop_macs / (2 * len(sample)) / unit, components=len(components), n_sample=len(sample),
    )  # fmt: skip


def print_variant(variant: str, m: Measured, rows: str) -> None:
    """What one variant measured: the engine's time and work, the loop's, their difference and the ratio."""
    print(f"{variant}: fast engine, all {m.components} components: {m.fast_s[variant]:.2f} s, "
          f"{m.prompt_passes[variant]:.2f} forward passes of {rows} (each at its own length, last-token logits), "
          f"{m.padded_passes[variant]:.2f} of {rows} right-padded with logits at every position")  # fmt: skip
    print(f"{variant}: per-component loop on the same length chunks, {m.n_sample} components timed, scaled to "
          f"{m.components}: {m.loop_s[variant]:.1f} s, {m.loop_prompt_passes:.2f} forward passes of {rows} per "
          "component")  # fmt: skip
    print(f"{variant}: max |fast - loop| on the sampled components: {m.worst[variant]:.2e}")
    print(f"{variant}: speedup {m.loop_s[variant] / m.fast_s[variant]:.1f}x")


if __name__ == "__main__":
    main()
