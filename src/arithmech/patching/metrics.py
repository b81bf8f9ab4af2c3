"""Patching metrics: pure functions of patched and reference answer logits."""

from __future__ import annotations

import torch


def relative_change(patched: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """(patched - ref) / |ref|, broadcasting ref [batch] against patched [..., batch] (METHODS.md sec. 2)."""
    return (patched - ref) / ref.abs()
