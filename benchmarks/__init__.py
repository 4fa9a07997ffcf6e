"""Benchmarks and the reliability harness; run from the repository root, never installed."""

__all__: list[str] = []
