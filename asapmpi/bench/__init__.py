"""Benchmarks of asapmpi; `python -m asapmpi.bench.core` measures the core runtime."""
