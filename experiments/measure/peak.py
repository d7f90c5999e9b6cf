"""The device's measured peak: a dense matmul timed at the sweep's start, on the device in the sweep's dtype.

MFU is achieved FLOP/s over this number. It is measured, never typed from a datasheet: the spec sheet's figure
(989 TFLOP/s bf16 dense for an H100 SXM) is not what a matmul reaches on the card at hand, and a CPU has none.
"""
from __future__ import annotations

import torch

from .point import Point
from .timing import TimingProtocol, time_call

# Square matmul sides: large enough to reach the device's rate, small enough to take well under a second.
MATMUL_SIDE = {"cuda": 8192, "cpu": 512}
PEAK_PROTOCOL = TimingProtocol(warmup=3, min_repeats=10, min_time_s=0.2, min_sample_ms=20.0)


def matmul_tflops(device: torch.device, dtype: torch.dtype, side: int | None = None,
                  protocol: TimingProtocol = PEAK_PROTOCOL) -> float:
    """TFLOP/s (10^12 FLOP/s, 2 per multiply-accumulate) of a `side` x `side` matmul on `device` in `dtype`."""
    side = side or MATMUL_SIDE.get(device.type, 512)
    a = torch.randn(side, side, device=device, dtype=dtype)
    b = torch.randn(side, side, device=device, dtype=dtype)
    timing = time_call(lambda: torch.mm(a, b), device, protocol)
    return 2 * side**3 / (timing.median_ms / 1e3) / 1e12


def peak_row(point: Point) -> dict[str, object]:
    """The calibration as a worker row (run through experiments/sweep/isolation.py, so the sweep's own process
    never holds a CUDA context): `device_peak_tflops` for the point's device, dtype and thread count."""
    from .run import DTYPES

    if point.num_threads:
        torch.set_num_threads(point.num_threads)
    return {"status": "ok", "device_peak_tflops": matmul_tflops(torch.device(point.device), DTYPES[point.dtype])}
