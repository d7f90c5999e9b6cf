"""Peak memory of one call, above what was allocated before it.

On CUDA the caching allocator keeps the peak for us. On CPU nothing does: tracemalloc sees no torch tensors,
`torch.accelerator` reports 0 and RSS is noisy. The profiler's memory events, however, record every allocation
and free of torch's CPU allocator, including those inside fused and custom ops; their running sum in time order
peaks exactly where the call peaked.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

MiB = 2**20


@dataclass(frozen=True)
class PeakMemory:
    allocated_mb: float  # peak bytes allocated during the call minus bytes allocated before it
    reserved_mb: float | None  # CUDA caching allocator's reserved peak; None on CPU
    method: str  # cuda_allocator | cpu_profiler
    total_mb: float | None = None  # CUDA: peak bytes allocated by the process during the call; None on CPU


def peak_memory(fn: Callable[[], object], device: torch.device) -> PeakMemory:
    """Runs `fn()` once and returns its peak memory above the baseline."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return PeakMemory(
            allocated_mb=(torch.cuda.max_memory_allocated(device) - baseline) / MiB,
            reserved_mb=torch.cuda.max_memory_reserved(device) / MiB,
            method="cuda_allocator",
            total_mb=torch.cuda.max_memory_allocated(device) / MiB,
        )
    return PeakMemory(allocated_mb=cpu_peak_bytes(fn) / MiB, reserved_mb=None, method="cpu_profiler")


def cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak of (bytes allocated - bytes freed) by torch's CPU allocator while `fn()` runs."""
    from torch.profiler import ProfilerActivity, profile

    with stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    return max(itertools.accumulate((nbytes for _, nbytes in events), initial=0))


@contextlib.contextmanager
def stderr_silenced():
    """Kineto prints a line to the C-level stderr at every profiler start and stop, with no switch to stop it."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
