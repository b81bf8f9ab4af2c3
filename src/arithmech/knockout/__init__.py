"""Knockout: replace components' outputs (mean, zero or resample ablation) and measure what the model loses."""
