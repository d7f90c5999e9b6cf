"""Measuring one point: what a point is, parameters and MACs, latency, peak memory, provenance (`run.measure_point`).
May import models, mixers and train (a point with epochs trains); must not import sweep or report.
Keep this file free of imports: the sweep's forkserver preloads `experiments.measure.run`, not this package.
"""
