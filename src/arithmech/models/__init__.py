"""Models: loading, the per-architecture specs, one view of any of them, and scoped hooks."""
