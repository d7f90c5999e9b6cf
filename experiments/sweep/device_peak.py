"""The matmul calibration at a sweep's start: each device, dtype and thread count its points use gets its measured
peak (experiments/measure/peak.py), which every row records as `device_peak_tflops` and divides its achieved
FLOP/s by (`mfu`). It runs in an isolated worker like a point, so the sweep never holds a CUDA context itself.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..measure.peak import peak_row
from ..measure.point import Point
from .isolation import run_isolated

CALIBRATION_TIMEOUT_S = 120.0


def with_device_peak(points: list[Point], say: Callable[[str], None]) -> list[Point]:
    """`points` with `device_peak_tflops` set from one calibration per (device, dtype, threads); a calibration
    that fails leaves its points at 0 (their MFU cells empty) and says why."""
    peaks: dict[tuple[str, str, int], float] = {}
    for setting in dict.fromkeys((p.device, p.dtype, p.num_threads) for p in points):
        device, dtype, threads = setting
        probe = Point(mixer="", preset="", img_size=1, patch_size=1, batch_size=1, device=device, dtype=dtype,
                      num_threads=threads)
        row = run_isolated(peak_row, probe, CALIBRATION_TIMEOUT_S)
        peak = row.get("device_peak_tflops")
        threads_note = f", {threads} thread{'s' * (threads != 1)}" if device == "cpu" and threads else ""
        if row.get("status") == "ok" and isinstance(peak, float) and peak > 0:
            peaks[setting] = peak
            say(f"device peak: {peak:.4g} TFLOP/s (a {dtype} matmul on {device}{threads_note}, measured now; "
                "rows divide by it for MFU)")
        else:
            say(f"device peak: not measured on {device} {dtype}{threads_note} ({row.get('error', 'no result')}); "
                "rows get no MFU")
    return [dataclasses.replace(p, device_peak_tflops=peaks.get((p.device, p.dtype, p.num_threads), 0.0))
            for p in points]
