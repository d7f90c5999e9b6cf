"""Latency by one protocol: warm up, time samples until both a count and a time are reached, take the median.

A sample is `k` calls timed back to back between two clock readings, with no synchronisation between the calls:
on a GPU (CUDA events) this keeps the host's time to issue a call out of the sample wherever the GPU is the slower
of the two, as Triton's `do_bench` and nvSubquadratic do; `k` is chosen so a sample lasts at least
`min_sample_ms`. A synchronisation after every call would make each sample max(host issue, GPU time) and let a
launch-bound curve run backwards. On a CPU the host clock times one call per sample (the host is the device).
"""
from __future__ import annotations

import math
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
        min_repeats: at least this many timed samples...
        min_time_s: ...and at least this much timed wall time in all.
        max_repeats: stop here even if min_time_s is not reached.
        min_sample_ms: on a GPU, each sample holds enough back-to-back calls to last at least this long.
        max_calls_per_sample: at most this many calls in one sample.
        max_batch: batch size `max` tries powers of two up to this one.
    """

    warmup: int = 2
    min_repeats: int = 5
    min_time_s: float = 1.0
    max_repeats: int = 1000
    min_sample_ms: float = 5.0
    max_calls_per_sample: int = 1000
    max_batch: int = 1024

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.min_time_s < 0 or self.min_sample_ms < 0:
            raise ValueError(f"timing: warmup, min_time_s and min_sample_ms must be >= 0, got {self.warmup}, "
                             f"{self.min_time_s}, {self.min_sample_ms}")
        if not 1 <= self.min_repeats <= self.max_repeats:
            raise ValueError(f"timing: need 1 <= min_repeats <= max_repeats, got {self.min_repeats}, "
                             f"{self.max_repeats}")
        if self.max_calls_per_sample < 1 or self.max_batch < 1:
            raise ValueError(f"timing: max_calls_per_sample and max_batch must be >= 1, got "
                             f"{self.max_calls_per_sample}, {self.max_batch}")


@dataclass(frozen=True)
class Timing:
    median_ms: float  # per call
    iqr_ms: float  # per call
    repeats: int  # samples
    calls_per_sample: int = 1


class HostClock:
    """Host wall time, synchronised with the device at both ends of a sample (never between its calls)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._started = 0.0

    def start(self) -> None:
        synchronize(self.device)
        self._started = time.perf_counter()

    def stop_ms(self) -> float:
        synchronize(self.device)
        return (time.perf_counter() - self._started) * 1e3


class CudaEventClock:
    """The GPU's own clock: a pair of CUDA events recorded on the current stream around a sample."""

    def __init__(self) -> None:
        self._start = self._end = None

    def start(self) -> None:
        self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._start.record()

    def stop_ms(self) -> float:
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end)


def _quartiles(samples: list[float]) -> tuple[float, float]:
    if len(samples) < 2:
        return samples[0], samples[0]
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return q[0], q[2]


def time_back_to_back(fn: Callable[[], object], clock: HostClock | CudaEventClock, protocol: TimingProtocol,
                      calls_per_sample: int | None = None) -> Timing:
    """Times `fn()` in samples of k back-to-back calls; returns the median and IQR of sample / k.

    Args:
        fn: the call to time.
        clock: where samples are read (`CudaEventClock` on a GPU; `HostClock` elsewhere, and in CPU tests).
        protocol: warm-up, repeats and the length of a sample.
        calls_per_sample: k; None chooses it from one call, so a sample lasts at least `protocol.min_sample_ms`.
    """
    for _ in range(protocol.warmup):
        fn()
    if calls_per_sample is None:
        clock.start()
        fn()
        once_ms = clock.stop_ms()
        wanted = math.ceil(protocol.min_sample_ms / max(once_ms, 1e-3))
        calls_per_sample = max(1, min(protocol.max_calls_per_sample, wanted))
    samples: list[float] = []
    total_s = 0.0
    while len(samples) < protocol.max_repeats and (
        len(samples) < protocol.min_repeats or total_s < protocol.min_time_s
    ):
        clock.start()
        for _ in range(calls_per_sample):
            fn()
        elapsed_ms = clock.stop_ms()
        samples.append(elapsed_ms / calls_per_sample)
        total_s += elapsed_ms / 1e3
    q1, q3 = _quartiles(samples)
    return Timing(median_ms=statistics.median(samples), iqr_ms=q3 - q1, repeats=len(samples),
                  calls_per_sample=calls_per_sample)


def time_call(fn: Callable[[], object], device: torch.device, protocol: TimingProtocol) -> Timing:
    """Times `fn()` on `device`: back to back between CUDA events on a GPU; one synchronised call per sample on
    the host clock elsewhere."""
    if device.type == "cuda":
        return time_back_to_back(fn, CudaEventClock(), protocol)
    return time_back_to_back(fn, HostClock(device), protocol, calls_per_sample=1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# A paired measurement (time_paired): each round times a block of the subject between two blocks of the reference;
# a block is one untimed call (the other model ran just before) and BLOCK_SAMPLES timed samples.
BLOCK_SAMPLES = 3
MIN_ROUNDS = 3


@dataclass(frozen=True)
class PairedTiming:
    ratio: float  # median over rounds of the subject block's median over the mean of the reference blocks around it
    ratio_iqr: float
    rounds: int


def time_paired(subject: Callable[[], object], reference: Callable[[], object], device: torch.device,
                protocol: TimingProtocol, clock: HostClock | CudaEventClock | None = None) -> PairedTiming:
    """`subject`'s time as a multiple of `reference`'s, the two timed in alternating blocks a few calls long.

    A machine whose speed drifts over minutes (a shared VM) moves two rows timed apart, but hardly a ratio whose
    parts ran seconds apart: the reference is timed before and after each subject block, and the ratio is taken
    per round. Rounds run until `protocol.min_repeats` (at least MIN_ROUNDS) and `protocol.min_time_s` of timed
    time are both reached, or `protocol.max_repeats`. Samples are taken as `time_call` takes them: one synchronised
    call on the host clock, or k back-to-back calls between CUDA events (k chosen once per call from its first
    block).
    """
    if clock is None:
        clock = CudaEventClock() if device.type == "cuda" else HostClock(device)
    block = TimingProtocol(warmup=1, min_repeats=BLOCK_SAMPLES, max_repeats=BLOCK_SAMPLES, min_time_s=0.0,
                           min_sample_ms=protocol.min_sample_ms, max_calls_per_sample=protocol.max_calls_per_sample)
    for _ in range(protocol.warmup):
        reference()
        subject()
    # calls per sample: one on the host clock; on a GPU chosen by each call's first block, then kept
    per_sample: dict[Callable[[], object], int | None] = dict.fromkeys(
        (subject, reference), None if device.type == "cuda" else 1)

    def block_ms(fn: Callable[[], object]) -> float:
        timing = time_back_to_back(fn, clock, block, per_sample[fn])
        per_sample[fn] = timing.calls_per_sample
        return timing.median_ms

    ratios: list[float] = []
    timed_s = 0.0
    before = block_ms(reference)
    while len(ratios) < protocol.max_repeats and (
        len(ratios) < max(MIN_ROUNDS, protocol.min_repeats) or timed_s < protocol.min_time_s
    ):
        subject_ms = block_ms(subject)
        after = block_ms(reference)
        ratios.append(subject_ms / ((before + after) / 2))
        timed_s += BLOCK_SAMPLES * (subject_ms + after) / 1e3
        before = after
    q1, q3 = _quartiles(ratios)
    return PairedTiming(ratio=statistics.median(ratios), ratio_iqr=q3 - q1, rounds=len(ratios))
