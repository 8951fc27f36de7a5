"""Test infrastructure: disposable multi-host environments for tests, benchmarks and demos."""
