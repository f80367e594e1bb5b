"""Benchmarks: two-phase vs streaming over the backlog vs plain batch, on the same data, in one run."""
