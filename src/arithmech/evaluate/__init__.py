"""Evaluation: math word problems by greedy generation, multiple choice by log-likelihood, general text by KL,
arithmetic on held-out templates and operand pairs in one teacher-forced pass (arithmetic.py), and
lm-evaluation-harness tasks through a bridge (harness.py).

Members are imported on first use (arithmech/lazy.py), so the benchmark registry needs no torch.
"""

from arithmech.lazy import lazy_exports

_EXPORTS = {
    "answers": ("extract_choice", "extract_number", "format_number", "numbers_match"),
    "arithmetic": ("AnswerScore", "score_answers"),
    "clustered_interval": ("clustered_difference", "clustered_wilson", "wilson_interval"),
    "benchmarks": ("Benchmark", "benchmark", "benchmark_names", "build_prompts", "register_benchmark"),
    "choice": ("ChoiceScore", "score_choices"),
    "general": ("GeneralResult", "general_scores"),
    "general_texts": ("GeneralText", "load_general_texts"),
    "generation": ("Generation", "generate_greedy"),
    "harness": ("HarnessOptions", "HarnessResult", "HarnessScore", "run_harness"),
    "loading": ("EvalItem",),
    "runner": ("BenchmarkResult", "EvalOptions", "EvalResult", "evaluate", "evaluate_benchmark"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
