"""Edge circuits on the default model: EAP, EAP-IG and the faithfulness sweep against one plain forward pass.

Times (wall, and the process's CPU time, which a loaded machine disturbs less), in one run on the same batch of
MIB-format prompts (one chunk of --prompts prompts):
- one plain forward pass of the batch (`model(input_ids, attention_mask)`, logits at every position), the unit;
- EAP and EAP-IG (m = --steps) over all edges, and the faithfulness sweep (10 sizes, signed and absolute
  rankings, CPR and CMD) of the EAP-IG scores;
and prints each as forward-pass equivalents (its time / the plain pass's) against its target: EAP-IG at
most 20, the sweep about 25. Peak memory per prompt of EAP-IG: torch.cuda.max_memory_allocated above what was
allocated before (CUDA), else the peak of the live tensors that its torch operations create (counted by a
dispatch mode until each is freed: what the computation holds at once), beside the analytic size of the tensors
EAP-IG keeps (its accumulated gradients, the two runs' sender outputs and their differences per sender, at the
positions after those that every prompt and counterfactual share).

    python benchmarks/circuits.py [--prompts 16] [--steps 5] [--model ID_OR_PATH] [--device cpu]
"""

from __future__ import annotations

import argparse
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from record import record
from timing import best_times
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from arithmech.circuits.attribution import edge_scores
from arithmech.circuits.faithfulness import faithfulness_sweep
from arithmech.circuits.graph import CircuitGraph
from arithmech.circuits.prompts import circuit_batch
from arithmech.data.mib_arithmetic import mib_pairs
from arithmech.models.load import ModelConfig, load_model

MIB = 2**20


class LiveTensors(TorchDispatchMode):
    """Bytes of the tensors that torch operations create inside the block and that are still alive, at their peak.

    Each new storage an operation returns is counted until it is freed (a weakref finalizer), so the peak is
    what the computation holds at once, whatever the allocator keeps resident."""

    def __init__(self, existing: Iterable[torch.Tensor]) -> None:
        super().__init__()
        self.existing = {t.untyped_storage().data_ptr() for t in existing}  # weights: views of them are not new
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live and key not in self.existing:
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    weakref.finalize(storage, self._free, key)
        self.peak = max(self.peak, self.current)
        return out

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)


def peak_memory(fn: Callable[[], Any], device: str, model: torch.nn.Module) -> tuple[float, str]:
    """Bytes `fn` holds at its peak above what was held before, and how it was measured."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - before), "torch.cuda.max_memory_allocated"
    with LiveTensors([*model.parameters(), *model.buffers()]) as tracker:
        fn()
    return float(tracker.peak), "peak of the live tensors its torch operations created"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5, help="EAP-IG interpolation steps (MIB: 5)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of the plain pass and EAP; best shown")
    args = parser.parse_args()

    torch.manual_seed(0)
    handle = load_model(ModelConfig(model=args.model, device=args.device, dtype=args.dtype))
    view, dims = handle.view, handle.dims
    graph = CircuitGraph.from_dims(dims, view.parallel_residual)
    batch = circuit_batch(handle.tokenizer, mib_pairs(handle.tokenizer, "addition", args.prompts))
    n, pos, shared = len(batch), int(batch.mask.shape[1]), batch.shared_positions
    device = view.o_proj(0).weight.device
    ids, mask = batch.clean_ids.to(device), batch.mask.to(device)
    print(
        f"model {handle.source.get('model')}: {dims.n_layers} layers x {dims.n_heads} query heads "
        f"({dims.n_kv_heads} kv heads), {graph.n_edges:,} edges; {n} MIB addition prompts, {pos} positions "
        f"(the first {shared} shared by every prompt and counterfactual)"
    )

    def eap_ig() -> torch.Tensor:
        return edge_scores(view, graph, batch, "eap-ig", steps=args.steps, batch_size=n)

    with torch.no_grad():
        _, plain_s, plain_cpu = best_times(lambda: view.model(input_ids=ids, attention_mask=mask), args.repeats + 1)
    _, eap_s, eap_cpu = best_times(lambda: edge_scores(view, graph, batch, "eap", batch_size=n), args.repeats)
    scores, eap_ig_s, eap_ig_cpu = best_times(eap_ig, 1)
    sweep, sweep_s, sweep_cpu = best_times(lambda: faithfulness_sweep(view, graph, batch, scores, batch_size=n), 1)
    peak, how = peak_memory(eap_ig, args.device, view.model)
    itemsize = torch.finfo(view.o_proj(0).weight.dtype).bits // 8
    senders = dims.d_model + dims.n_layers * (dims.n_heads * dims.d_head + dims.d_model)  # numbers per position
    per_position = 4 * graph.n_receivers * dims.d_model + 2 * itemsize * senders + 4 * graph.n_senders * dims.d_model
    stored = (pos - shared) * per_position

    print(f"one plain forward pass of the batch: {plain_s:.3f} s wall, {plain_cpu:.3f} s CPU (the unit below)")
    rows = [("EAP, all edges", eap_s, eap_cpu, ""),
            (f"EAP-IG, all edges, m = {args.steps}", eap_ig_s, eap_ig_cpu, " (target: at most 20)"),
            ("faithfulness sweep, 10 sizes", sweep_s, sweep_cpu, " (target: about 25)")]  # fmt: skip
    for what, wall, cpu, bound in rows:
        print(f"{what:<32} {wall:8.2f} s = {wall / plain_s:6.2f} forward passes by wall time, "
              f"{cpu / plain_cpu:6.2f} by CPU time{bound}")  # fmt: skip
    print(f"sweep of the EAP-IG scores: CPR {sweep.cpr:.3f}, CMD {sweep.cmd:.3f}")
    print(f"EAP-IG peak memory per prompt: {peak / n / MIB:.1f} MiB ({how}); "
          f"kept: {stored / MIB:.1f} MiB per prompt ({pos - shared} positions after the shared)")  # fmt: skip
    record("circuits", args, {
        "plain_forward_s": plain_s, "eap_s": eap_s, "eap_ig_s": eap_ig_s, "sweep_s": sweep_s,
        "eap_passes": eap_s / plain_s, "eap_ig_passes": eap_ig_s / plain_s, "sweep_passes": sweep_s / plain_s,
        "eap_cpu_passes": eap_cpu / plain_cpu, "eap_ig_cpu_passes": eap_ig_cpu / plain_cpu,
        "sweep_cpu_passes": sweep_cpu / plain_cpu,
        "eap_ig_peak_mib_per_prompt": peak / n / MIB, "eap_ig_stored_mib_per_prompt": stored / MIB,
    })  # fmt: skip


if __name__ == "__main__":
    main()
