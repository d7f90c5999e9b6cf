"""What the machine can give a sweep right now: free cores, a thread count, a time limit per point, its load.

On a shared CPU machine the sweep adapts instead of assuming it is alone (KERNELS.md, "CPU threads on a busy
machine"): OpenMP threads spin at barriers, so two threads on two cores with one core taken by another process
ran a training epoch 4x slower than on a quiet machine, and 2.5x slower than one thread. The sweep therefore

- sets `OMP_WAIT_POLICY=PASSIVE` for its workers where other work keeps a core busy when its fork server starts
  (`openmp_wait_policy`, applied in isolation.py), so a waiting thread sleeps instead of taking the core from the thread it
  waits for; on a quiet machine the runtime's default stays (passive waits cost every parallel region a wake-up);
- fixes glibc's malloc thresholds for its workers (isolation.py's `MALLOC_ENV`), so a point is not timed slower
  for the page faults of a heap that glibc trims after every call;
- runs each CPU point on the cores that were free when the sweep started (`num_threads = 0`);
- keeps a user's `timeout_s` as each point's limit; where none was given (0), gives each point a limit relative to
  its predicted cost on this machine at this load (a calibrated matmul rate), never less than `AUTOMATIC_FLOOR_S`;
- records the 1-minute load average at the sweep's start and at each point's end in every row.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace

from ..measure.point import Point

# A point's limit is this multiple of its predicted seconds: the prediction counts matmul work only (no Python
# overhead, data generation or counting), so it is a floor on the real time, and a generous multiple of it only
# stops points that are truly stuck or far beyond their size.
LIMIT_MULTIPLE = 20.0
# The least limit a point gets when the user gave none: a hung point is stopped after this long at most when its
# prediction is small (or unknown).
AUTOMATIC_FLOOR_S = 1800.0
# A core counts as taken by other work when it is busier than this share of its time.
TAKEN_CORE = 0.25


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average (runnable and uninterruptible tasks), or NaN where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user time
    return total - idle, total


def busy_cores(sample_s: float = 1.0) -> float:
    """Cores that other processes keep busy now: sampled from /proc/stat over `sample_s` (the load average lags
    by a minute, so a process that started seconds ago would not show), the load average where that fails."""
    first = _cpu_times()
    if first is None:
        load = load_average()
        return 0.0 if math.isnan(load) else load
    time.sleep(sample_s)
    second = _cpu_times()
    busy, total = second[0] - first[0], second[1] - first[1]
    return (os.cpu_count() or 1) * busy / total if total > 0 else 0.0


def choose_threads(cpus: int, busy: float) -> int:
    """Threads for a point: the cores not taken by others (a core counts as taken when it is over TAKEN_CORE
    busy), at least one."""
    return max(1, min(cpus, math.floor(cpus - busy + (1 - TAKEN_CORE))))


def openmp_wait_policy(busy: float) -> str | None:
    """OMP_WAIT_POLICY for the points: PASSIVE where other work keeps a core busy (`busy` cores), else None, the
    OpenMP runtime's default (spin a while at a barrier, then sleep).

    Passive waits are what a shared machine needs: a spinning thread took the core from the thread it waited for
    (this module's docstring). On a quiet machine they cost every parallel region a wake-up: a batch-1 forward of
    the tiny ViT at 196 tokens ran far slower on an Intel Xeon, less so on an AMD EPYC (81add95's message has the
    measurement), so the small-N end of every CPU wall measured wake-ups, which is not how a user's PyTorch runs.
    """
    return "PASSIVE" if busy > TAKEN_CORE else None


def matmul_rate(threads: int) -> float:
    """Multiply-accumulates per second of a micro-sized fp32 matmul on `threads` threads, measured now, so it
    already reflects what other processes leave of the machine."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(256, 192), torch.randn(192, 768)
        for _ in range(3):
            a @ b
        samples = []
        deadline = time.perf_counter() + 0.3
        while time.perf_counter() < deadline or len(samples) < 5:
            started = time.perf_counter()
            for _ in range(10):
                a @ b
            samples.append((time.perf_counter() - started) / 10)
    finally:
        torch.set_num_threads(previous)
    samples.sort()
    return 256 * 192 * 768 / samples[len(samples) // 2]


def predicted_macs(point: Point, macs_per_image: int) -> float:
    """Multiply-accumulates a point will do: timed inference calls, the training step's, counting, training."""
    timing = point.timing
    calls = timing.warmup + max(timing.min_repeats, 1) + 1  # + one forward for fvcore's count
    work = calls * point.planned_batch * macs_per_image
    if point.measure_train_step:
        work += 3 * (timing.warmup + max(timing.min_repeats, 1)) * point.planned_batch * macs_per_image
    if point.epochs:
        samples = json.loads(point.train).get("train_samples") or 50_000
        work += point.epochs * samples * macs_per_image * 3.5  # forward + backward, and the evaluation
    return float(work)


def time_limit(point: Point, macs_per_image: int | None, rate: float) -> float:
    """The point's limit in seconds: the user's `point.timeout_s` where given (a limit is a limit: a prediction
    that assumes 50,000 samples must not stretch 5 s into hours); otherwise (0) `LIMIT_MULTIPLE` x its predicted
    time at `rate` plus the timed minimum the protocol asks for, at least `AUTOMATIC_FLOOR_S`."""
    if point.timeout_s > 0:
        return point.timeout_s
    if not macs_per_image or not rate > 0:
        return AUTOMATIC_FLOOR_S
    timed = point.timing.min_time_s * (2 if point.measure_train_step else 1)
    predicted = predicted_macs(point, macs_per_image) / rate + timed
    return max(AUTOMATIC_FLOOR_S, LIMIT_MULTIPLE * predicted)


def with_limits_given(points: list[Point]) -> list[Point]:
    """The points with a limit of `AUTOMATIC_FLOOR_S` where none was given, for a launcher that predicts nothing
    (a cluster's job runs on another machine)."""
    return [p if p.timeout_s > 0 else replace(p, timeout_s=AUTOMATIC_FLOOR_S) for p in points]


def fit_to_machine(points: list[Point], threads: int, rate: float, macs: dict) -> list[Point]:
    """The points with this machine's thread count (CPU points that asked for 0) and their time limits.

    Args:
        points: the points to run.
        threads: from `choose_threads`.
        rate: from `matmul_rate`.
        macs: analytic MACs per image by point key (None where unknown).
    """
    fitted = []
    for point in points:
        if point.device == "cpu" and point.num_threads == 0:
            point = replace(point, num_threads=threads)
        fitted.append(replace(point, timeout_s=time_limit(point, macs.get(point.key), rate)))
    return fitted
