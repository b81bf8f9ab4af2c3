"""Arithmetic task data: templates, generated prompt pairs, user prompt files, and their tokenization.

Members are imported on first use (arithmech/lazy.py), so reading templates or prompt files needs no torch.
"""

from arithmech.lazy import lazy_exports

_EXPORTS = {
    "arithmetic_split": ("ArithmeticSplit", "make_split", "split_prompts", "transfer_prompts"),
    "generate": ("GenerationConfig", "build_pair", "generate_pairs", "solve"),
    "io": ("read_prompt_file", "write_prompt_file"),
    "prompts": ("ROLE_NAMES", "PromptPair"),
    "templates": ("FORMATIONS", "OPERATIONS", "Template", "default_templates_path", "load_templates",
                  "select_templates"),
    "tokens": ("ROLE_CODES", "TokenizedPairs", "TokenizeReport", "answer_token_id", "pad_id_of", "tokenize_pairs"),
}  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
