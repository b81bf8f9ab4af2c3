"""The plan record: plan.json and its table. Memory is "planned" and time "estimated" everywhere, never measured.

plan.json holds the model's shape, the dtype, the device profile, the budget (--max-memory) and, per stage, its
`StagePlan` (planner.py); it is written atomically (runs.atomic_write_json), so a refused plan writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arithmech import __version__
from arithmech.plan.devices import BANDWIDTH_EFFICIENCY, MATMUL_EFFICIENCY, DeviceProfile
from arithmech.plan.memory import PARTS
from arithmech.plan.planner import StagePlan
from arithmech.plan.shape import ModelShape
from arithmech.plan.sizes import format_size


@dataclass(frozen=True)
class Plan:
    """Every planned stage of one model, dtype and device."""

    shape: ModelShape
    dtype: str
    device: DeviceProfile
    processes: int
    stages: list[StagePlan]
    max_memory: int | None = None
    widths_from: str = "assumed"
    """Where the stages' prompt widths come from: "read" with the model's tokenizer, "given" (--prompt-tokens) or
    "assumed"."""

    @property
    def widths(self) -> str:
        """Where the prompt widths the stages are planned at come from, in words."""
        tokens = ", ".join(f"{s.stage} {s.tokens}" for s in self.stages)
        if self.widths_from == "read":
            return (f"prompt widths read with the model's tokenizer, each stage's widest prompt ({tokens} tokens); "
                    "time is estimated at it too, an upper bound")  # fmt: skip
        if self.widths_from == "given":
            return f"prompt widths as given by --prompt-tokens ({tokens} tokens)"
        return (f"prompt widths assumed ({tokens} tokens): this model has no tokenizer on this machine; "
                "--prompt-tokens sets one, and a stage's memory budget reads the real ones before it runs")

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": "arithmech plan: memory is planned and time estimated, from the model's shape only",
            "arithmech_version": __version__,
            "model": self.shape.as_dict(),
            "dtype": self.dtype,
            "device_profile": {**self.device.as_dict(), "matmul_efficiency": MATMUL_EFFICIENCY,
                               "bandwidth_efficiency": BANDWIDTH_EFFICIENCY},  # fmt: skip
            "processes": self.processes,
            "max_memory": self.max_memory,
            "prompt_widths": self.widths,
            "stages": [
                {**s.as_dict(), "fits_max_memory": None if self.max_memory is None else
                 {k: m.peak <= self.max_memory for k, m in s.memory.items()}}
                for s in self.stages
            ],
        }  # fmt: skip

    def table(self) -> list[str]:
        """Plain-text lines: one row per stage and process layout."""
        s = self.shape
        head = (f"{s.name}: {s.n_params / 1e9:.2f} B parameters ({s.n_layers} layers x {s.d_model}, {s.n_heads} "
                f"heads / {s.n_kv_heads} key-value, vocabulary {s.d_vocab}), {self.dtype}, time estimated for "
                f"{self.device.name}" + (f", {self.processes} processes" if self.processes > 1 else ""))  # fmt: skip
        columns = ["stage", "layout", "planned peak", *(p.replace("activations_", "act. ") for p in PARTS),
                   "work (passes)", "estimated time"]  # fmt: skip
        rows = [columns]
        for plan in self.stages:
            for layout, memory in plan.memory.items():
                seconds = plan.seconds.get(layout)
                work = "n/a" if plan.work is None else f"{plan.work.passes:,.1f}"
                rows.append([plan.stage, layout,
                             format_size(memory.peak), *(format_size(getattr(memory, p)) for p in PARTS), work,
                             "n/a" if seconds is None else _duration(seconds)])  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
        lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.append(self.widths[:1].upper() + self.widths[1:])
        for plan in self.stages:
            if plan.sizes.get("host_bytes") and self.device.kind != "cpu":
                lines.append(f"{plan.stage} also keeps {format_size(plan.sizes['host_bytes'])} in host memory (its "
                             "results' CPU tensors), not in the GPU's")  # fmt: skip
        if self.max_memory is not None:
            over = [f"{p.stage} ({k})" for p in self.stages for k, m in p.memory.items() if m.peak > self.max_memory]
            lines.append(f"--max-memory {format_size(self.max_memory)}: "
                         + (f"over it: {', '.join(over)}" if over else "every stage fits"))  # fmt: skip
        return lines


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"~{seconds:.1f} s"
    if seconds < 7200:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.1f} h"
