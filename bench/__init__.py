"""Benchmarks: rotator side by side with the alternatives (see bench/README)."""
