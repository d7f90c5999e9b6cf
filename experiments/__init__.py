"""Experiment scripts: sweeps, measurements, training, data sets and the report."""
