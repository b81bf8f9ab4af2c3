"""The ablation modes and the smallest ablation group, importable without torch: stage configs check them
before a model loads.

What each mode puts in place of a component's output, and why groups below `MIN_GROUP_SIZE` fall back to the
END mean, is explained in `knockout/ablation.py`.
"""

from __future__ import annotations

ABLATION_MODES: tuple[str, ...] = ("mean", "zero", "resample")

MIN_GROUP_SIZE = 4
"""Smallest template-and-length group whose mean (or another member) ablates; smaller groups fall back to END."""
