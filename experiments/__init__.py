"""Experiments, one sub-package per stage: sweep -> measure / train -> report, plus bench; configs/ holds sweeps.
`schema` (the runs.csv columns) is shared by every stage and imports only the standard library.
"""
import os

# Quiet the profiler that measures CPU memory (kineto's start/stop lines, c10's notes about blocks allocated
# before profiling); both are read when torch loads, so they are set before anything imports it.
os.environ.setdefault("KINETO_LOG_LEVEL", "5")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
