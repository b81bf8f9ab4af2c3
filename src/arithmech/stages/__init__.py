"""Stages: each takes a model handle and a config, writes its run folder, and returns a typed result."""
