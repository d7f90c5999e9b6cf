"""Batch size `max`: the largest power-of-two batch that fits, found when the point runs (timm's benchmark idea:
measure throughput where the device is full, and back off when memory runs out).

Batches double from 1, one call each, until a call runs out of memory or the protocol's `max_batch` is reached;
the measurement then runs at the largest that fitted and halves the batch on an out-of-memory (a full measurement
can need more than one probe call: the allocator's cache, a training step's optimizer state). Inference and the
training step each search their own.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .oom import is_out_of_memory
from .timing import TimingProtocol

Result = TypeVar("Result")

# A probe of the search: one untimed call of the full measurement at one batch (the sweep's planner prices it too).
PROBE_TIMING = TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.0, min_sample_ms=0.0)


def largest_fitting_batch(probe: Callable[[int], object], limit: int, free: Callable[[], None]) -> int:
    """The largest power of two <= `limit` whose `probe(batch)` does not run out of memory.

    Raises:
        The out-of-memory error of batch 1, when nothing fits.
    """
    fitted, batch = 0, 1
    while batch <= limit:
        try:
            probe(batch)
        except Exception as error:  # noqa: BLE001 - only out-of-memory ends the search
            if not is_out_of_memory(error) or fitted == 0:
                raise
            break
        finally:
            free()
        fitted, batch = batch, batch * 2
    return fitted


def at_max_batch(measure: Callable[[int], Result], probe: Callable[[int], object], limit: int,
                 free: Callable[[], None]) -> tuple[int, Result]:
    """`measure(batch)` at the largest batch that fits, halving it while the measurement runs out of memory.

    Args:
        measure: the full measurement at one batch.
        probe: one call at one batch (the search's test of fitting).
        limit: the largest batch tried (a power of two or not; batches are powers of two up to it).
        free: returns cached memory after each probe and each out-of-memory.

    Returns:
        The batch measured and its result.

    Raises:
        The out-of-memory error when even batch 1 does not fit.
    """
    batch = largest_fitting_batch(probe, limit, free)
    while True:
        try:
            return batch, measure(batch)
        except Exception as error:  # noqa: BLE001
            if not is_out_of_memory(error) or batch == 1:
                raise
        free()
        batch //= 2
