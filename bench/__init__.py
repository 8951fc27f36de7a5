"""Benchmarks and evaluation scripts (run as ``python -m bench.<name>``)."""
