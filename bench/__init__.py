"""Benchmarks: each module prints ratios against a baseline measured in the same run.

Never part of the pytest run (pytest's testpaths is tests/). See BENCHMARKS.md.
"""
