"""A point timed beside a reference mixer, call for call, so its ratio to the reference survives a machine whose
speed drifts.

Rows time each point alone, and a ratio between two rows (experiments/report/ratios.py) divides timings taken
minutes apart: on a shared VM the same code's step moved between two rows of one sweep by more than the
differences measured (results/cpu_train_micro_xeon at 7537f99). With `paired_reference` in the config, a point's
worker, after its own measurements, also builds the reference mixer's model at the same point (the reference's
default options, the same model overrides, compiled alike) and times the two in alternating blocks
(`timing.time_paired`), for the forward at the row's inference batch and the training step at its training batch.
The row's own latency and step stay those timed alone, as in every other row.
"""
from __future__ import annotations

import torch

from models import ViT

from .calls import forward_call, random_images, train_step_calls
from .compiled import compile_model, compiled_first_call
from .oom import is_out_of_memory
from .point import Point
from .timing import time_paired


def measure_paired(subject: ViT, reference: ViT, point: Point, dtype: torch.dtype, device: torch.device,
                   row: dict[str, object]) -> dict[str, object]:
    """The point's forward and training step over the reference's, timed alternately at the batches `row` used.

    Args:
        subject: the point's model as it was timed (compiled where the point is).
        reference: the reference mixer's model at the same point (`point.reference_point`), not compiled yet.
        row: the point's row so far: which of its timings ran (`latency_ms`, `train_status`) and at what batch.

    Returns:
        The columns `paired_reference` and `<latency|train_step>_vs_ref[_iqr]` that were measured; {} where the
        point has no timing to pair.

    Raises:
        whatever building, compiling or calling either model raises: run.py keeps the point's own timings and
        notes why these columns are empty.
    """
    timed_reference = compile_model(reference, point.compile) if point.compile else reference
    result: dict[str, object] = {}
    if row.get("latency_ms") is not None:
        batch = int(row["batch_used"])
        subject_call = forward_call(subject, random_images(subject, batch, device, dtype))
        reference_call = forward_call(timed_reference, random_images(reference, batch, device, dtype))
        result.update(_paired(subject_call, reference_call, point, device, "latency"))
    if row.get("train_status") == "ok":
        batch = int(row["train_batch_used"])
        subject_call = train_step_calls(subject, dtype, device, batch).step
        reference_call = train_step_calls(timed_reference, dtype, device, batch).step
        result.update(_paired(subject_call, reference_call, point, device, "train_step"))
    return {"paired_reference": point.paired_reference, **result} if result else {}


def _paired(subject, reference, point: Point, device: torch.device, metric: str) -> dict[str, float]:
    for call in (subject, reference):  # compilation (a compiled point's) outside the timed blocks
        compiled_first_call(call, point, lambda error: is_out_of_memory(error, bool(point.memory_limit_mb)))
    timing = time_paired(subject, reference, device, point.timing)
    return {f"{metric}_vs_ref": timing.ratio, f"{metric}_vs_ref_iqr": timing.ratio_iqr}
