"""Achieved FLOP/s and model FLOPs utilisation (MFU) of a row, from its counted work and its measured time.

Inference does 2 x macs_analytic FLOPs per image (the analytic count, reconciled with both counters in tests).
A training step does `train_flops_counted` per image: forward and backward counted by FlopCounterMode on the meta
device, so what a backward recomputes is counted, not taken as 2x the forward. The optimizer step is not counted.
MFU divides by the device's measured matmul rate (experiments/measure/peak.py), never by a datasheet figure.
"""
from __future__ import annotations

import math


def _rate(flops_per_image: object, batch: object, milliseconds: object) -> float | None:
    values = [flops_per_image, batch, milliseconds]
    if any(v in (None, "") for v in values):
        return None
    flops_per_image, batch, milliseconds = (float(v) for v in values)
    if not (math.isfinite(milliseconds) and milliseconds > 0):
        return None
    return flops_per_image * batch / (milliseconds / 1e3) / 1e12


def add_rates(row: dict, device_peak_tflops: float | None) -> dict[str, object]:
    """The rate columns of `row`: achieved_tflops, train_achieved_tflops, their MFU, and the peak they divide by
    (cells stay empty where a number they need is missing)."""
    peak = device_peak_tflops if device_peak_tflops and device_peak_tflops > 0 else None
    macs = row.get("macs_analytic")
    inference = _rate(2 * float(macs) if macs not in (None, "") else None, row.get("batch_used"),
                      row.get("latency_ms"))
    train = _rate(row.get("train_flops_counted"), row.get("train_batch_used"), row.get("train_step_ms"))
    return {
        "device_peak_tflops": peak,
        "achieved_tflops": inference,
        "mfu": inference / peak if inference is not None and peak else None,
        "train_achieved_tflops": train,
        "train_mfu": train / peak if train is not None and peak else None,
    }
