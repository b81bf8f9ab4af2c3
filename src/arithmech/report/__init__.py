"""Figures and reports, built from a run folder's artefacts."""
