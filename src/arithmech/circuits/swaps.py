"""The swapped part of every receiver's input in a patched pass, computed from the sparser side of the circuit.

A receiver r of a circuit reads its residual plus, for every edge outside the circuit, the swap term of its
sender (`patched.py`):
    delta_r = sum_s swap[r, s] t_s,        t_s = out_s(ablated) - out_s(this run)      [batch, pos, d_model]
Summed directly that costs edges x batch x pos x d_model multiply-accumulates per circuit, as much as half a
forward pass on SmolLM2, whatever the circuit. A small circuit swaps almost every edge, so the same sum is taken
from the edges it keeps instead:
    delta_r = P_r - sum_s keep'[r, s] t_s,      P_r = sum of t_s over all senders r reads (a prefix sum),
with keep' = 1 - swap on the edges. Per circuit and layer of receivers, the side with fewer nonzero entries is
used, as one matrix product over the receivers and senders that have one. A small circuit's receivers with no
kept edge then all read one input, resid + P (a large circuit's receivers with no swapped edge: resid), so the
receivers of a layer are returned as that shared base plus the few that deviate from it (`split`): the patched
pass norms and projects the base once and only the deviating receivers one by one.

Terms are stored per circuit, [circuit, sender, prompt x pos x d_model] (rows of a patched batch are circuit-major),
with the prefix sums at each block boundary (embedding, a layer's heads, an MLP).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from arithmech.circuits.graph import CircuitGraph


@dataclass
class SwapTerms:
    """The swap terms added so far (in sender order) and the receiver inputs they give."""

    graph: CircuitGraph
    swap: torch.Tensor
    """[circuit, receiver, sender] 1 - keep on the edges, 0 elsewhere."""
    terms: torch.Tensor | None = None  # [circuit, sender, prompt * (pos - start) * d_model]
    count: int = 0
    prefix: dict[int, torch.Tensor] = field(default_factory=dict)
    """n -> [circuit, prompt * (pos - start) * d_model], the sum of the first n terms."""
    start: int = 0
    """The first position with a swap term: before it the prompts and their ablation share their tokens, so
    every sender's output is the same in both runs (causal attention); set from the first term added."""

    @property
    def circuits(self) -> int:
        return int(self.swap.shape[0])

    def add(self, term: torch.Tensor) -> None:
        """Append the terms of the next senders, [senders, batch, pos, d_model] (batch = circuit x prompt): the
        first (the input embedding's) at every position, the later ones from `start` on."""
        s = int(term.shape[0])
        if self.terms is None:  # the input embedding's term, at every position
            differs = (term != 0).any(-1).flatten(0, 1).any(0).nonzero()  # [pos]
            self.start = int(differs[0]) if len(differs) else int(term.shape[2]) - 1
            term = term[:, :, self.start :]
        t = term.reshape(s, self.circuits, -1).transpose(0, 1)  # [circuit, senders, K]
        if self.terms is None:
            self.terms = t.new_empty(self.circuits, self.graph.n_senders, t.shape[-1])
        self.terms[:, self.count : self.count + s] = t
        before = self.prefix.get(self.count)
        total = t.sum(1)
        self.prefix[self.count + s] = total if before is None else before + total
        self.count += s

    def split(self, receivers: slice, resid: torch.Tensor) -> tuple[torch.Tensor, Iterator[Deviation]]:
        """The receivers' inputs as a base shared by all of them, [batch, pos, d_model] (resid, plus the prefix
        of the circuits summed from their kept edges), and the receivers of each circuit that differ from it,
        one circuit at a time as they are read (a caller that drops each before the next holds one circuit's).

        The receivers must read the same senders (a layer's 3H head inputs, or one receiver)."""
        reads = {self.graph.senders_before(r) for r in range(receivers.start, receivers.stop)}
        assert len(reads) == 1, "the receivers of one split read the same senders"
        (count,) = reads
        if self.terms is None:
            return resid, iter(())
        swap = self.swap[:, receivers, : self.count].to(resid.dtype)  # [circuit, receiver, sender]
        valid = self.graph.valid[receivers, : self.count].to(swap.device, resid.dtype)
        coefficients, shifted = [], []
        for c in range(self.circuits):
            swapped = swap[c]
            kept = valid - swapped  # nonzero on edges (partly) kept
            n_swapped, n_kept = int(swapped.count_nonzero()), int(kept.count_nonzero())
            if n_swapped == 0:
                continue
            if n_kept < n_swapped:  # delta = prefix - the kept edges' terms
                coefficients.append((c, -kept))
                shifted.append(c)
            else:
                coefficients.append((c, swapped))
        terms = self.terms  # filter, not a named loop variable: nothing here keeps a deviation the caller dropped
        deviations = filter(None, (self._product(c, coeff, terms[c]) for c, coeff in coefficients))
        if not shifted:
            return resid, deviations
        base = resid.clone()
        late = self.per_circuit(base)[shifted, :, self.start :]  # [shifted, prompt, pos - start, d_model]
        self.per_circuit(base)[shifted, :, self.start :] = late + self.prefix[count][shifted].reshape(late.shape)
        return base, deviations

    def per_circuit(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, pos, d_model] -> [circuit, prompt, pos, d_model] (a view)."""
        return x.view(self.circuits, -1, *x.shape[1:])

    def receiver_inputs(self, receivers: slice, resid: torch.Tensor) -> torch.Tensor:
        """[receivers, batch, pos, d_model]: resid [batch, pos, d_model] plus each receiver's swapped terms."""
        n = receivers.stop - receivers.start
        base, deviations = self.split(receivers, resid)
        x = base[None].repeat(n, 1, 1, 1)  # [receiver, batch, pos, d_model]
        per_circuit = x.view(n, self.circuits, -1, *x.shape[2:])  # [receiver, circuit, prompt, pos, d_model]
        for dev in deviations:
            late = per_circuit[:, dev.circuit, :, self.start :]
            late.index_add_(0, dev.rows, dev.delta.reshape(len(dev.rows), *late.shape[1:]))
        return x

    @staticmethod
    def _product(circuit: int, coeff: torch.Tensor, terms: torch.Tensor) -> Deviation | None:
        """coeff [receiver, sender] @ terms [sender, K] on the receivers (rows) and senders with a nonzero entry."""
        nonzero = coeff != 0
        rows, cols = nonzero.any(1).nonzero().flatten(), nonzero.any(0).nonzero().flatten()
        if len(rows) == 0:
            return None
        if 2 * len(cols) > coeff.shape[1]:  # most senders: the stored prefix as it is, no gathered copy
            return Deviation(circuit, rows, coeff[rows] @ terms[: coeff.shape[1]])
        return Deviation(circuit, rows, coeff[rows][:, cols] @ terms.index_select(0, cols))


@dataclass(frozen=True)
class Deviation:
    """Receivers of one circuit whose input differs from the base: base + delta."""

    circuit: int
    rows: torch.Tensor
    """[n] receiver positions within the split."""
    delta: torch.Tensor
    """[n, prompt * (pos - start) * d_model]: at positions from `SwapTerms.start` on."""
