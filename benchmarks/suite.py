"""The benchmark suite as data: each script, its two sizes, and how each measurement it records is judged.

Two sizes of every benchmark are kept in benchmarks/results.json:

- quick (`make bench`, `compare.py`): small enough to run after every change (about 7.5 min on 2 idle CPU cores),
  compared with the previous quick results to catch a slowdown or a broken correctness check;
- full (`compare.py --full`): the sizes docs/performance.md reports (each script's defaults; about 19 min on 2 idle
  cores). `readme_tables.py` renders that page's Performance tables from both, so it quotes nothing
  that results.json does not hold.

`compare.py` runs and compares them; `readme_tables.py` says how each is shown there.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Size = Literal["quick", "full"]
SIZES: tuple[Size, ...] = ("full", "quick")
"""In the order docs/performance.md shows them."""


@dataclass(frozen=True)
class Performance:
    """A measurement compared with the previous one: which way is better, and whether it depends on the machine."""

    higher_is_better: bool
    same_machine_only: bool
    worse: str
    """What a regression of it means, for the verdict."""


RATIO = Performance(higher_is_better=True, same_machine_only=False, worse="slower")
"""A speedup or memory saving of one method over another, both measured in the same run."""
SCORE = Performance(higher_is_better=True, same_machine_only=False, worse="agrees less")
"""Agreement of an approximation with the exact method: deterministic, so it moves only when the code does."""
SECONDS = Performance(higher_is_better=False, same_machine_only=True, worse="slower")
PER_SECOND = Performance(higher_is_better=True, same_machine_only=True, worse="slower")
GIB = Performance(higher_is_better=False, same_machine_only=True, worse="uses more memory")
MIB = GIB
"""Memory in MiB (per prompt): compared like GiB."""
PASSES = Performance(higher_is_better=False, same_machine_only=False, worse="slower")
"""A time in forward passes of the same batch, both measured in the same run: lower is better."""


@dataclass(frozen=True)
class Check:
    """A correctness measurement: broken when `holds` is false, however fast the run and whatever came before."""

    rule: str
    holds: Callable[[Any], bool]


def at_most(limit: float) -> Check:
    """Two methods computing the same numbers must agree to `limit`."""
    return Check(f"must be <= {limit:g}", lambda value: isinstance(value, (int, float)) and value <= limit)


AGREE = Check("must be true", lambda value: value is True)
COUNT = Check("must be a positive whole number", lambda value: isinstance(value, int) and value > 0)
RECORDED = Check("must be a positive number", lambda value: isinstance(value, (int, float)) and value > 0)
"""A number recorded to describe a run (prompt lengths, the spread of repeated timings), not compared."""
TALLY = Check("must be a whole number, 0 or more", lambda value: isinstance(value, int) and value >= 0)
NONE = Check("must be 0", lambda value: value == 0)
ROWS = Check("must be a list of rows", lambda value: isinstance(value, list))
"""Every measurement of a benchmark that records a table (rendered elsewhere: `readme_tables.ELSEWHERE`)."""
TEXT = Check("must be text", lambda value: isinstance(value, str) and bool(value))


@dataclass(frozen=True)
class Benchmark:
    """One script, the arguments of each size, and how each measurement it records is compared."""

    name: str
    args: tuple[str, ...]
    """Quick size: what `make bench` runs."""
    metrics: Mapping[str, Performance | Check]
    full_args: tuple[str, ...] = ()
    """Full size: what docs/performance.md reports (`compare.py --full`); the script's defaults, spelled out."""
    needs_cuda: bool = False
    requires: tuple[str, ...] = ()
    """Modules of an optional extra the script compares with; without them `compare.py` leaves it out."""
    install: str = ""
    """How to install `requires`."""
    on_demand: bool = False
    """Run only when named (`compare.py --only NAME`): its full size takes hours on a CPU."""

    def missing(self) -> list[str]:
        """The modules of `requires` that cannot be imported here."""
        return [name for name in self.requires if importlib.util.find_spec(name) is None]

    def script_args(self, device: str, size: Size = "quick") -> list[str]:
        """The script's arguments; gpu_scan.py has no --device (it always runs on CUDA)."""
        sized = self.full_args if size == "full" else self.args
        return [*sized] if self.needs_cuda else [*sized, "--device", device]


PEER_PROMPT_SETS = {"short": 2, "default": 3}
"""The prompt sets benchmarks/peers.py times, by name: their solved examples before the query
(`ReferenceSetConfig.few_shot`). With SmolLM2's tokenizer "short" is about 30 tokens a prompt (the cost model's
T = 30), "default" the default reference set's 45."""


def peers_metrics() -> dict[str, Performance | Check]:
    """benchmarks/peers.py's measurements on each prompt set: ratios and times are medians of interleaved
    repetitions, their min and max only recorded; the budgets in forward passes of the prompts are larger on the
    shorter prompts (the per-sender work does not shrink with them)."""
    budgets = {"short": (8.0, 6.5), "default": (6.0, 5.0)}  # total, path, by PEER_PROMPT_SETS' names
    metrics: dict[str, Performance | Check] = {}
    for name, (total, path) in budgets.items():
        metrics.update({
            f"{name}_total_prompt_passes": at_most(total), f"{name}_path_prompt_passes": at_most(path),
            f"{name}_total_passes": PASSES, f"{name}_path_passes": PASSES, f"{name}_prompts": COUNT,
            f"{name}_tokens": RECORDED, f"{name}_padded_width": COUNT, f"{name}_prompt_forward_s": SECONDS,
            f"{name}_total_s": SECONDS, f"{name}_total_s_min": RECORDED, f"{name}_total_s_max": RECORDED,
            f"{name}_path_s": SECONDS,
        })  # fmt: skip
        for peer in ("tl", "nnsight"):
            metrics.update({
                f"{name}_total_vs_{peer}": RATIO, f"{name}_total_vs_{peer}_min": RECORDED,
                f"{name}_total_vs_{peer}_max": RECORDED, f"{name}_{peer}_max_abs_diff": at_most(1e-5),
                f"{name}_{peer}_s_per_head": SECONDS, f"{name}_{peer}_s_per_head_min": RECORDED,
                f"{name}_{peer}_s_per_head_max": RECORDED, f"{name}_{peer}_prompt_passes_per_head": PASSES,
            })  # fmt: skip
    return metrics


# Quick sizes: about 7.5 minutes on 2 idle CPU cores (knockout: 2 min, so its ratio is not at the mercy of noise).
BENCHMARKS = (
    Benchmark(
        "path_patching",
        ("--prompts", "32", "--sample", "8"),
        {
            "speedup": RATIO, "fast_s": SECONDS, "loop_s": SECONDS, "max_abs_diff": at_most(1e-4),
            "path_prompt_passes": at_most(5.0), "path_passes": PASSES, "total_speedup": RATIO, "total_s": SECONDS,
            "total_loop_s": SECONDS, "total_max_abs_diff": at_most(1e-4), "total_prompt_passes": at_most(6.0),
            "total_passes": PASSES, "loop_prompt_passes": at_most(1.1), "components": COUNT,
        },
        full_args=("--prompts", "64", "--sample", "12"),
    ),  # fmt: skip
    Benchmark(
        "answer_digits",
        ("--prompts", "12", "--sample", "6"),
        {
            "speedup": RATIO, "fast_s": SECONDS, "loop_s": SECONDS, "max_abs_diff": at_most(1e-4),
            "path_prompt_passes": at_most(5.0), "path_passes": PASSES, "total_speedup": RATIO, "total_s": SECONDS,
            "total_loop_s": SECONDS, "total_max_abs_diff": at_most(1e-4), "total_prompt_passes": at_most(6.0),
            "total_passes": PASSES, "loop_prompt_passes": at_most(1.1), "components": COUNT, "rows": COUNT,
            "answer_tokens": COUNT,
        },
        full_args=("--prompts", "32", "--sample", "12"),
    ),  # fmt: skip
    Benchmark(
        "knockout",
        ("--prompts", "32", "--max-k", "8", "--n-random", "2"),
        {"speedup": RATIO, "batched_s": SECONDS, "loop_s": SECONDS, "accuracies_agree": AGREE,
         "max_prob_diff": at_most(1e-5)},  # fmt: skip
        full_args=("--prompts", "32", "--max-k", "16", "--n-random", "3"),
    ),
    Benchmark(
        "attribution",
        ("--prompts", "16", "--repeats", "2"),
        {
            "speedup": RATIO, "exact_s": SECONDS, "attribution_s": SECONDS,
            "spearman_all": SCORE, "spearman_heads": SCORE, "spearman_mlps": SCORE, "top10_overlap": SCORE,
        },
        full_args=("--prompts", "64", "--repeats", "2"),
    ),  # fmt: skip
    Benchmark(
        "mediation",
        ("--pairs", "4", "--sample", "24"),
        {"speedup": RATIO, "batched_s": SECONDS, "loop_s": SECONDS, "max_scaled_ie_diff": at_most(1e-3)},
        full_args=("--pairs", "8", "--sample", "48"),
    ),
    Benchmark(
        "finetune",
        ("--steps", "3", "--batch-size", "4", "--max-samples", "64"),
        {
            "speedup": RATIO, "memory_ratio": RATIO,
            "precise_samples_per_s": PER_SECOND, "full_samples_per_s": PER_SECOND,
        },
        full_args=("--steps", "3", "--batch-size", "4", "--max-samples", "64"),  # the defaults are already small
    ),  # fmt: skip
    Benchmark(
        "circuits",
        ("--prompts", "8", "--repeats", "1"),
        {
            "eap_passes": PASSES, "eap_ig_passes": PASSES, "sweep_passes": PASSES, "plain_forward_s": SECONDS,
            "eap_cpu_passes": PASSES, "eap_ig_cpu_passes": PASSES, "sweep_cpu_passes": PASSES,
            "eap_s": SECONDS, "eap_ig_s": SECONDS, "sweep_s": SECONDS, "eap_ig_peak_mib_per_prompt": MIB,
            "eap_ig_stored_mib_per_prompt": MIB,
        },
        full_args=("--prompts", "16", "--repeats", "2"),
    ),  # fmt: skip
    Benchmark(
        "peers",
        ("--prompts", "16", "--heads", "4", "--repeats", "3"),
        {"components": COUNT, "repeats": COUNT, **peers_metrics()},
        full_args=("--prompts", "64", "--heads", "12", "--repeats", "3"),
        requires=("transformer_lens", "nnsight"),
        install='pip install "arithmech[peers]"',
    ),
    Benchmark(
        "circuit_oracle",
        ("--prompts", "4", "--receivers", "4", "--senders", "6"),
        {
            "speedup": RATIO, "oracle_ms_per_edge": SECONDS, "naive_ms_per_edge": SECONDS,
            "max_abs_diff": at_most(1e-4), "oracle_passes_per_edge": at_most(1.0),
            "model_passes_per_edge": at_most(1.0), "work_ratio": RATIO,
        },
        full_args=("--prompts", "8", "--receivers", "6", "--senders", "8"),
    ),  # fmt: skip
    Benchmark(
        "numbers_sweep",
        ("--max-prompts", "8", "--max-pairs", "120", "--layers", "0,8,16", "--sites", "a.units", "--shuffles", "2",
         "--check-cells", "2"),
        {
            "sweep_passes": PASSES, "naive_passes": RECORDED, "work_ratio": RATIO, "stage_passes": PASSES,
            "stage_s": SECONDS, "naive_s": SECONDS, "speedup": RATIO, "max_abs_diff": at_most(1e-4), "pairs": COUNT,
            "variants": COUNT,
        },
        full_args=("--max-prompts", "16", "--max-pairs", "240", "--layers", "0,8,16,24", "--sites", "a.tens,a.units",
                   "--shuffles", "3", "--check-cells", "2"),
    ),  # fmt: skip
    Benchmark(
        "plan_skeletons",
        ("--quick",),
        {
            "runs_measured": COUNT, "runs_failed": NONE, "runs_skipped": TALLY, "runs_within_tolerance": TALLY,
            "planned_over_measured_min": RECORDED, "planned_over_measured_max": RECORDED,
            "memory_measured_as": TEXT, "rows": ROWS, "growth": ROWS,
        },
        # every stage run on a 23 GiB machine with a 40 GiB swap file (`swapon`): the float32 full SFT of the
        # 128k-256k vocabularies plans up to 36 GiB of peak; swapped pages leave the allocator's peak, which is
        # compared, as it is (the process RSS beside it is then not comparable), and take 5 to 15 minutes a run
        full_args=("--resume", "runs/bench/plan_skeletons-full.jsonl", "--max-memory", "40GiB", "--stages",
                   "identify-path,identify-total,knockout,circuit,mediation,mediation-neurons,neurons,evaluate,"
                   "finetune-precise,finetune-full"),
        on_demand=True,
    ),  # fmt: skip
    Benchmark(
        "skeleton_numerics",
        ("--quick",),
        {
            "rows_measured": COUNT, "nonfinite": TALLY, "max_rel_diff_bfloat16": RECORDED,
            "max_rel_diff_float16": RECORDED, "min_top_agreement": RECORDED, "rows": ROWS,
        },
        full_args=(),
        on_demand=True,
    ),  # fmt: skip
    Benchmark(
        "gpu_scan",
        ("--prompts", "128", "--layers", "16"),
        {"speedup": RATIO, "fast_s": SECONDS, "prompts_per_s": PER_SECOND, "peak_memory_gib": GIB,
         "max_abs_diff": at_most(1e-2),  # fp16: rounding of the relative change, not calibrated on a GPU yet
         "planned_gib": RECORDED, "measured_gib": GIB, "estimated_s": RECORDED},  # the plan beside
        full_args=("--prompts", "256", "--layers", "32"),
        needs_cuda=True,
    ),
    Benchmark(
        "gpu_finetune",
        ("--steps", "2", "--layers", "16"),
        {
            "speedup": RATIO, "memory_ratio": RATIO, "precise_s_per_step": SECONDS, "full_s_per_step": SECONDS,
            "precise_peak_gib": GIB, "full_peak_gib": GIB, "precise_planned_gib": RECORDED,
            "full_planned_gib": RECORDED, "precise_measured_gib": GIB, "full_measured_gib": GIB,
            "precise_estimated_s_per_step": RECORDED, "full_estimated_s_per_step": RECORDED,
        },
        full_args=("--steps", "3", "--layers", "32"),
        needs_cuda=True,
    ),
)
