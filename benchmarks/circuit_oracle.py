"""The exact edge oracle vs one full patched forward pass per edge, on the same edges, in one run.

The oracle (`circuits/oracle.exact_edge_scores`) batches the edges of a receiver and starts each pass at the
receiver's layer and at the first position where the clean and counterfactual prompts differ; the loop runs one
patched forward pass of the whole model per edge (`patched_end_resid`, all edges kept but that one). Both give
m(clean) - m(edge patched); the script asserts they agree, and prints the time per edge of each, their ratio,
the work of each in forward passes of the batch (linear-layer multiply-accumulates, tests/forward_cost.py) and
the oracle's cost model (its docstring), on MIB addition prompts of the default model (or --model).

Edges: --receivers receivers drawn at random (seeded), with up to --senders of their senders each, so that
receivers of every depth and the oracle's batching over a receiver's senders both show.

    python benchmarks/circuit_oracle.py [--prompts 8] [--receivers 6] [--senders 8] [--model ID_OR_PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from record import record  # noqa: E402

from arithmech.circuits.batch import logit_difference  # noqa: E402
from arithmech.circuits.graph import CircuitGraph  # noqa: E402
from arithmech.circuits.oracle import exact_edge_scores, predicted_passes  # noqa: E402
from arithmech.circuits.patched import patched_end_resid  # noqa: E402
from arithmech.circuits.prompts import circuit_batch  # noqa: E402
from arithmech.circuits.senders import collect_sender_outputs  # noqa: E402
from arithmech.data.mib_arithmetic import mib_pairs  # noqa: E402
from arithmech.models.load import ModelConfig, load_model  # noqa: E402

from forward_cost import count_work, plain_forward_macs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--receivers", type=int, default=6)
    parser.add_argument("--senders", type=int, default=8, help="senders per receiver (at most)")
    parser.add_argument("--circuits-per-pass", type=int, default=16)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    handle = load_model(ModelConfig(model=args.model, device=args.device, dtype=args.dtype))
    view = handle.view
    graph = CircuitGraph.from_dims(handle.dims, view.parallel_residual)
    batch = circuit_batch(handle.tokenizer, mib_pairs(handle.tokenizer, "addition", args.prompts, args.seed))
    gen = torch.Generator().manual_seed(args.seed)
    edges: list[tuple[int, int]] = []
    for receiver in torch.randperm(graph.n_receivers, generator=gen)[: args.receivers].tolist():
        senders = torch.randperm(graph.senders_before(receiver), generator=gen)[: args.senders].tolist()
        edges += [(receiver, s) for s in senders]
    dims = handle.dims
    print(f"model {handle.source.get('model')}: {dims.n_layers} layers x {dims.n_heads} heads ({dims.n_kv_heads} kv); "
          f"{len(batch)} MIB addition pairs of {batch.clean_ids.shape[1]} tokens; {len(edges)} edges into "
          f"{args.receivers} receivers")  # fmt: skip

    def naive() -> torch.Tensor:
        """One full patched forward pass per edge."""
        full = torch.ones(graph.n_receivers, graph.n_senders)
        cf = collect_sender_outputs(view, batch.cf_ids, batch.mask)
        clean, _ = patched_end_resid(view, graph, batch.clean_ids, batch.mask, full, cf)
        m_clean = logit_difference(view, clean, batch)
        out = []
        for receiver, sender in edges:
            keep = full.clone()
            keep[receiver, sender] = 0.0
            resid, _ = patched_end_resid(view, graph, batch.clean_ids, batch.mask, keep, cf)
            out.append(float((m_clean - logit_difference(view, resid, batch)).double().mean()))
        return torch.tensor(out)

    def oracle() -> torch.Tensor:
        return exact_edge_scores(
            view, graph, batch, edges, circuits_per_pass=args.circuits_per_pass, batch_size=len(batch)
        )

    plain = plain_forward_macs(view.model, batch.clean_ids, batch.mask)
    results = {}
    for name, fn in (("oracle", oracle), ("naive", naive)):
        with torch.no_grad(), count_work(view.model) as work:
            start = time.perf_counter()
            scores = fn()
            seconds = time.perf_counter() - start
        results[name] = (scores, seconds, work.macs / plain)
    (fast, fast_s, fast_passes), (loop, loop_s, loop_passes) = results["oracle"], results["naive"]
    diff = float((fast - loop).abs().max())
    scale = float(loop.abs().max())
    assert diff <= 1e-4 * max(1.0, scale), f"the oracle and the naive loop disagree by {diff:.2e}"
    model_passes = predicted_passes(graph, batch, edges, len(batch))
    n = len(edges)
    print(f"oracle:      {1e3 * fast_s / n:8.1f} ms per edge, {fast_passes:7.2f} forward passes measured "
          f"({fast_passes / n:.3f} per edge); cost model {model_passes:.2f} ({model_passes / n:.3f} per edge)")
    print(f"naive loop:  {1e3 * loop_s / n:8.1f} ms per edge, {loop_passes:7.2f} forward passes measured "
          f"({loop_passes / n:.3f} per edge); cost model {n + 1:.2f} (1 per edge, + the clean pass)")
    print(f"speedup {loop_s / fast_s:.1f}x in time, {loop_passes / fast_passes:.1f}x in work; "
          f"max |oracle - naive| = {diff:.2e} (largest score {scale:.3f})")
    print("(measured passes count every linear layer the model runs, the q/k/v projections of the grouped-query "
          "replicas included; the cost model counts decoder layers x positions)")
    record("circuit_oracle", args, {
        "speedup": loop_s / fast_s, "oracle_ms_per_edge": 1e3 * fast_s / n, "naive_ms_per_edge": 1e3 * loop_s / n,
        "max_abs_diff": diff, "oracle_passes_per_edge": fast_passes / n, "model_passes_per_edge": model_passes / n,
        "work_ratio": loop_passes / fast_passes,
    })  # fmt: skip


if __name__ == "__main__":
    main()
