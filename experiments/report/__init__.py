"""The report: tables, figures, exponent fits and crossovers rebuilt from runs.csv (`python -m experiments.report`).
Reads files only: it must not import torch, mixers, models, measure, train or sweep (a test checks torch).
"""
