"""Patching: reading and replacing component outputs to measure what they cause."""
