"""A model's context length, and the check that prompts fit in it before a stage scans them.

A prompt longer than the positions a model was built for fails deep inside the forward pass (GPT-2's learned
position embeddings raise IndexError) or, with rotary positions, runs past the lengths it was trained on. So
every stage that builds its own prompts checks the longest one once, right after tokenizing and before the
first forward pass: with learned position embeddings it refuses with one sentence that says how to make the
prompts shorter; with rotary positions, which compute past the limit, it warns that those positions are
extrapolation. Stages that read an identify run's prompts need no check of their own: the run was made (and
checked) with the same model.

Usage
    >>> context_length(handle.model)                          # 8192 for SmolLM2, None when the config says nothing
    >>> check_fits_context(handle.model, tokenized.ref_ids.shape[1])
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from arithmech.errors import ConfigError

logger = logging.getLogger(__name__)

SHORTER = "fewer solved examples (--few-shot 0 or 1), shorter prompts or templates, or a model with a longer context"
"""How to make prompts fit, for the message of a stage that builds prompts from templates."""


def context_length(model: Any) -> int | None:
    """The longest sequence the model takes (max_position_embeddings / n_positions), if its config says."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if value:
            return int(value)
    return None


def learned_positions(model: Any) -> bool:
    """Whether the model has a position embedding table (GPT-2's wpe): an embedding besides the token one."""
    tokens = model.get_input_embeddings()
    return any(isinstance(m, nn.Embedding) and m is not tokens for m in model.modules())


def check_fits_context(model: Any, longest: int, fix: str = SHORTER) -> None:
    """For a prompt of `longest` tokens past the model's context: ConfigError with learned positions, which end
    there, else a warning; `fix` says what to change."""
    limit = context_length(model)
    if limit is None or longest <= limit:
        return
    if learned_positions(model):
        raise ConfigError(
            f"the longest prompt has {longest} tokens, more than the {limit} positions the model takes; use {fix}"
        )
    logger.warning("the longest prompt has %d tokens, more than the %d positions the model was built for: the "
                   "positions past them are extrapolation; use %s", longest, limit, fix)  # fmt: skip
