"""Standalone benchmarks, not part of a sweep: `python -m experiments.bench.mixers`, `python -m experiments.bench.scan`.
May import mixers and measure's timing and provenance; nothing imports them.
"""
