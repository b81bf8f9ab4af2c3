"""Evaluation: math word problems by greedy generation, multiple choice by log-likelihood, general text by KL,
arithmetic on held-out templates and operand pairs in one teacher-forced pass (arithmetic.py), and
lm-evaluation-harness tasks through a bridge (harness.py)."""

from arithmech.evaluate.answers import extract_choice, extract_number, format_number, numbers_match
from arithmech.evaluate.arithmetic import AnswerScore, score_answers, wilson_interval
from arithmech.evaluate.benchmarks import Benchmark, benchmark, benchmark_names, build_prompts, register_benchmark
from arithmech.evaluate.choice import ChoiceScore, score_choices
from arithmech.evaluate.general import GeneralResult, general_scores, load_general_texts
from arithmech.evaluate.generation import Generation, generate_greedy
from arithmech.evaluate.harness import HarnessOptions, HarnessResult, HarnessScore, run_harness
from arithmech.evaluate.loading import EvalItem
from arithmech.evaluate.runner import BenchmarkResult, EvalOptions, EvalResult, evaluate, evaluate_benchmark

__all__ = [
    "AnswerScore",
    "Benchmark",
    "BenchmarkResult",
    "ChoiceScore",
    "EvalItem",
    "EvalOptions",
    "EvalResult",
    "GeneralResult",
    "Generation",
    "HarnessOptions",
    "HarnessResult",
    "HarnessScore",
    "benchmark",
    "benchmark_names",
    "build_prompts",
    "evaluate",
    "evaluate_benchmark",
    "extract_choice",
    "extract_number",
    "format_number",
    "general_scores",
    "generate_greedy",
    "load_general_texts",
    "numbers_match",
    "register_benchmark",
    "run_harness",
    "score_answers",
    "score_choices",
    "wilson_interval",
]
