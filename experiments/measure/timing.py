"""Latency by one protocol: warm up, synchronise, repeat until both a count and a time are reached, take the median."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TimingProtocol:
    """How long and how often to time.

    Args:
        warmup: untimed calls first (allocator, kernel selection, caches).
        min_repeats: at least this many timed calls...
        min_time_s: ...and at least this much timed wall time in all.
        max_repeats: stop here even if min_time_s is not reached.
    """

    warmup: int = 2
    min_repeats: int = 5
    min_time_s: float = 1.0
    max_repeats: int = 1000

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.min_time_s < 0:
            raise ValueError(f"timing: warmup and min_time_s must be >= 0, got {self.warmup}, {self.min_time_s}")
        if not 1 <= self.min_repeats <= self.max_repeats:
            raise ValueError(f"timing: need 1 <= min_repeats <= max_repeats, got {self.min_repeats}, {self.max_repeats}")


@dataclass(frozen=True)
class Timing:
    median_ms: float
    iqr_ms: float
    repeats: int


def _quartiles(samples: list[float]) -> tuple[float, float]:
    if len(samples) < 2:
        return samples[0], samples[0]
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return q[0], q[2]


def time_call(fn: Callable[[], object], device: torch.device, protocol: TimingProtocol) -> Timing:
    """Times `fn()` on `device`: CUDA events on a GPU (the device clock), a synchronised host clock elsewhere."""
    for _ in range(protocol.warmup):
        fn()
    synchronize(device)
    samples: list[float] = []
    total = 0.0
    while len(samples) < protocol.max_repeats and (
        len(samples) < protocol.min_repeats or total < protocol.min_time_s
    ):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            elapsed_ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            elapsed_ms = (time.perf_counter() - t0) * 1e3
        samples.append(elapsed_ms)
        total += elapsed_ms / 1e3
    q1, q3 = _quartiles(samples)
    return Timing(median_ms=statistics.median(samples), iqr_ms=q3 - q1, repeats=len(samples))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
