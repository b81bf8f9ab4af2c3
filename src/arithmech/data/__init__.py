"""Arithmetic task data: templates, generated prompt pairs, user prompt files, and their tokenization."""

from arithmech.data.arithmetic_split import ArithmeticSplit, make_split, split_prompts, transfer_prompts
from arithmech.data.generate import GenerationConfig, build_pair, generate_pairs, solve
from arithmech.data.io import read_prompt_file, write_prompt_file
from arithmech.data.prompts import ROLE_NAMES, PromptPair
from arithmech.data.templates import (
    FORMATIONS,
    OPERATIONS,
    Template,
    default_templates_path,
    load_templates,
    select_templates,
)
from arithmech.data.tokens import (
    ROLE_CODES,
    TokenizedPairs,
    TokenizeReport,
    answer_token_id,
    pad_id_of,
    tokenize_pairs,
)

__all__ = [
    "FORMATIONS",
    "OPERATIONS",
    "ROLE_CODES",
    "ROLE_NAMES",
    "ArithmeticSplit",
    "GenerationConfig",
    "PromptPair",
    "Template",
    "TokenizeReport",
    "TokenizedPairs",
    "answer_token_id",
    "build_pair",
    "default_templates_path",
    "generate_pairs",
    "load_templates",
    "make_split",
    "pad_id_of",
    "read_prompt_file",
    "select_templates",
    "solve",
    "split_prompts",
    "tokenize_pairs",
    "transfer_prompts",
    "write_prompt_file",
]
