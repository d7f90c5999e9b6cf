"""The sweep's cost planner: predicted latency, memory and wall time per point, an order that draws every curve
early, and a time budget that stops cleanly and resumes.

Calibration (`Planner.build`), best source first:
1. rows already measured on this device: the sweep's own runs.csv (a resumed sweep), and while a sweep runs,
   every row it appends (the fit is refreshed after each point);
2. where the device is here: a short calibration run of a few small points of each mixer, measured for real,
   each in its own process with a time limit, and none started after the run's bound (a dry run's, a budget's);
3. where it is not (a CUDA plan drawn on a CPU machine): runs.csv files of that device kind under results/
   (or given with --calibrate-from), and the output names the GPU and row count it assumes;
4. nothing: the plan says it is uncalibrated and gives MACs and an analytic memory estimate only.

A point the planner cannot predict is named in the plan with the reason (`Planner.unknown_reason`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..measure.point import Point, point_group, reference_point, wants_pairing
from ..measure.throughput import PROBE_TIMING
from ..measure.timing import BLOCK_SAMPLES, MIN_ROUNDS, TimingProtocol
from ..schema import MAX_BATCH
from .costmodel import ELEM_BYTES, MiB, CostModel, _number, point_from_row, work
from .runs_file import RunsFileError, latest_by_key, read_rows

# A point's predicted time in a budgeted sweep may exceed the time left by this much before it is held back:
# predictions of small points are noisy and a point that would just fit is worth starting.
BUDGET_SLACK = 1.0
# Quick protocol of the calibration run: a few calls per size are enough to fit rates.
CALIBRATION_TIMING = TimingProtocol(warmup=1, min_repeats=3, min_time_s=0.0, max_repeats=3)
# Point wall time between two rows that the point's own point_seconds does not see (process start, writing the row)
# until this run has seen some: measured by the calibration run; this floor only covers a run that did not calibrate.
DEFAULT_GAP_S = 0.1
# A calibration point that takes longer than this is stopped (its size is not used): it is meant to be small.
CALIBRATION_POINT_LIMIT_S = 60.0

PREDICTION_COLUMNS = {
    "latency_ms": "predicted_latency_ms", "train_step_ms": "predicted_train_step_ms",
    "peak_mem_mb": "predicted_peak_mem_mb", "train_peak_mem_mb": "predicted_train_peak_mem_mb",
}


@dataclass(frozen=True)
class Prediction:
    point: Point
    gmacs: float
    latency_ms: float | None
    train_step_ms: float | None  # None when the point does not measure a training step
    peak_mem_mb: float | None
    train_peak_mem_mb: float | None
    train_s: float | None  # training epochs, when epochs > 0
    point_s: float | None  # wall time of the whole point, None when uncalibrated
    fits: bool | None  # whether the larger of the two peaks fits the device memory (None: memory unknown)
    batch: int  # the batch the inference is predicted at (for batch max, the largest predicted to fit)
    train_batch: int | None  # the training step's, None when the point measures none

    def columns(self) -> dict[str, object]:
        """The prediction as runs.csv cells, so the report can set it beside what was measured."""
        row = {PREDICTION_COLUMNS[k]: getattr(self, k) for k in PREDICTION_COLUMNS}
        row["predicted_point_s"] = self.point_s
        return {k: v for k, v in row.items() if v is not None}


def protocol_seconds(ms: float, protocol: TimingProtocol) -> float:
    """Seconds `time_call` spends on a call of `ms` milliseconds, plus the one call that reads peak memory."""
    t = max(ms, 1e-6) / 1e3
    repeats = min(max(protocol.min_repeats, math.ceil(protocol.min_time_s / t)), protocol.max_repeats)
    return (protocol.warmup + repeats + 1) * t


def paired_seconds(ms: float, reference_ms: float, protocol: TimingProtocol) -> float:
    """Seconds `time_paired` spends on a call of `ms` beside a reference call of `reference_ms` (without the
    reference's compile): the protocol's warm-up, a first block of the reference, then its rounds."""
    s, r = max(ms, 1e-6) / 1e3, max(reference_ms, 1e-6) / 1e3
    block = BLOCK_SAMPLES + 1  # one untimed call per block
    rounds = min(max(MIN_ROUNDS, protocol.min_repeats, math.ceil(protocol.min_time_s / (BLOCK_SAMPLES * (s + r)))),
                 protocol.max_repeats)
    return protocol.warmup * (s + r) + block * r + rounds * block * (s + r)


def resident_mb(point: Point, batch: int, training: bool) -> float:
    """What a call's measured peak leaves out (it is taken above the memory held before the call) but the device
    must hold beside it: the input batch of 3-channel images and the weights; for a training step fp32 master
    weights, their gradients and AdamW's two moments, and an fp32 input."""
    params, image = work(dataclasses.replace(point, batch_size=1)).params, 3 * point.img_size ** 2
    if training:
        return (16 * params + 4 * image * batch) / MiB
    return ELEM_BYTES[point.dtype] * (params + image * batch) / MiB


def _train_steps(point: Point, used: int | None = None) -> tuple[int, int] | None:
    """(optimizer steps of the whole training, images per step), or None if the data set size is unknown.

    Args:
        used: the training images a measured row trained on (its `train_samples`, validation split removed).
    """
    from ..train.recipe import TrainRecipe
    from ..train.validation import validation_count
    from .costmodel import json_loads

    recipe = TrainRecipe(epochs=point.epochs, **json_loads(point.train))
    if used:
        return point.epochs * math.ceil(used / recipe.batch_size), recipe.batch_size
    samples = recipe.train_samples or (_npz_train_images(point.data_path) if point.dataset == "npz" else None)
    if not samples:
        return None
    samples -= validation_count(samples, recipe.val_fraction)  # held out of the steps
    return point.epochs * math.ceil(samples / recipe.batch_size), recipe.batch_size


@functools.lru_cache(maxsize=None)
def _npz_train_images(data_path: str) -> int | None:
    """How many training images an .npz data set holds (its labels are read, not its images), None if unreadable."""
    import numpy as np

    try:
        with np.load(data_path, allow_pickle=False) as f:
            return len(f["y_train"])
    except (OSError, KeyError, ValueError):
        return None


class Planner:
    """Predicts each point from a `CostModel` and refits it as rows arrive."""

    def __init__(self, samples: list[tuple[Point, dict]], sources: list[str], memory_mb: float | None,
                 memory_source: str, gap_s: float) -> None:
        self.samples = samples
        self.sources = sources
        self.memory_mb = memory_mb
        self.memory_source = memory_source
        self.gap_s = gap_s
        self._gaps: list[float] = []
        self.model = CostModel.fitted(samples, sources)
        self._train_ratio: dict[str, float] = {}
        self._fit_training()

    # calibration -------------------------------------------------------------------------------------------------
    @classmethod
    def build(cls, points: list[Point], runs_path: Path, *, extra_runs: list[Path] = (),
              calibrate: bool = True, calibration_s: float = math.inf,
              say: Callable[[str], None] | None = None) -> Planner:
        """Fits the cost model to the best rows there are for `points` (see the module docstring); `say`, if
        given, hears one line before a calibration run starts."""
        devices = {p.device for p in points}
        here = {d for d in devices if _device_here(d)}
        protocol = points[0].timing if points else TimingProtocol()
        samples: list[tuple[Point, dict]] = []
        sources: list[str] = []
        gap_s = None
        for path in [runs_path, *extra_runs]:
            rows = _ok_rows(path, devices)
            if rows:
                samples += [_with_overhead(r, protocol) for r in rows]
                sources.append(f"{len(rows)} rows of {path} ({_describe_devices(rows)})")
            elif path in extra_runs:
                sources.append(f"{path}: no ok rows of {', '.join(sorted(devices))}, not used")
        missing_here = [p for p in points if p.device in here]
        if calibrate and missing_here:
            calibration = calibration_points(missing_here, samples)
            if calibration:
                if say:
                    bound = "" if math.isinf(calibration_s) else f", for at most {calibration_s:.0f} s"
                    say(f"calibrating the cost model here: {len(calibration)} small points{bound} "
                        "(--calibrate-from RUNS_CSV of this machine skips the mixers it holds at three sizes)")
                started = time.perf_counter()
                rows, gap_s, stopped = run_calibration(calibration, calibration_s)
                samples += [(point_from_row(r), r) for r in rows]
                note = (f" (stopped at its {calibration_s:g} s bound: a larger size took longer)" if stopped else "")
                sources.append(f"calibration run here: {len(rows)} of {len(calibration)} small points measured in "
                               f"{time.perf_counter() - started:.1f} s{note}")
        absent = devices - here
        if absent and not any(p.device in absent for p, _ in samples):
            for path in sorted(Path("results").glob("*/runs.csv")):
                rows = _ok_rows(path, absent)
                if rows:
                    samples += [_with_overhead(r, protocol) for r in rows]
                    sources.append(f"{len(rows)} rows of {path} ({_describe_devices(rows)}): assumes that device")
        memory_mb, memory_source = device_memory_mb(points, samples)
        return cls(samples, sources, memory_mb, memory_source, gap_s if gap_s is not None else DEFAULT_GAP_S)

    def observe(self, point: Point, row: dict) -> None:
        """Adds a measured row and refits, so later predictions use it."""
        if row.get("status") != "ok":
            return
        searched = point.batch_size == MAX_BATCH  # a live row has no key columns yet: the point says so
        if searched:  # fitted at the batch it found, as a row read back from runs.csv is
            point = dataclasses.replace(point, batch_size=int(_number(row.get("batch_used")) or 1))
        self.samples.append(_with_overhead({k: str(v) for k, v in row.items()}, point.timing, point, searched))
        self.model = CostModel.fitted(self.samples, self.sources)
        self._fit_training()

    def observe_gap(self, seconds: float) -> None:
        """Adds a gap between two rows of the running sweep (wall time the point's own seconds do not see); after
        three, their median replaces the calibration's estimate."""
        self._gaps.append(max(seconds, 0.0))
        if len(self._gaps) >= 3:
            self.gap_s = sorted(self._gaps)[len(self._gaps) // 2]

    def _fit_training(self) -> None:
        """Training time per mixer as a multiple of (steps x predicted train step at the training batch): the
        multiple absorbs data generation, loading and evaluation."""
        ratios: dict[str, list[float]] = {}
        for point, row in self.samples:
            if point.epochs <= 0 or not row.get("point_seconds"):
                continue
            used = int(_number(row.get("train_samples")) or 0) or None
            base, without = self._train_base_s(point, used), self._point_s_without_training(point)
            if base is None or without is None:  # no cost rows yet to split the point's time (a resumed training run)
                continue
            spent = float(row["point_seconds"]) - without
            if base and spent > 0:
                ratios.setdefault(CostModel.group(point), []).append(spent / base)
                ratios.setdefault("*", []).append(spent / base)
        self._train_ratio = {k: sorted(v)[len(v) // 2] for k, v in ratios.items()}

    # prediction --------------------------------------------------------------------------------------------------
    def predict(self, point: Point) -> Prediction:
        m = self.model
        infer, train = self.as_measured(point)
        latency = m.predict(infer, "latency_ms")
        train_step = m.predict(train, "train_step_ms") if train else None
        peak = m.predict(infer, "peak_mem_mb")
        train_peak = m.predict(train, "train_peak_mem_mb") if train else None
        train_s = None
        if point.epochs > 0:
            base = self._train_base_s(point)
            ratio = self._train_ratio.get(CostModel.group(point), self._train_ratio.get("*", 1.0))
            train_s = base * ratio if base is not None else None
        point_s = self._point_s_without_training(point, (infer, train))
        if point_s is not None and point.epochs > 0:
            point_s = point_s + train_s if train_s is not None else None
        largest = max((v for v in (peak, train_peak) if v is not None), default=None)
        fits = None if self.memory_mb is None or largest is None else largest <= self.memory_mb
        return Prediction(point, work(point).macs / point.planned_batch / 1e9, latency, train_step, peak, train_peak,
                          train_s, point_s, fits, infer.batch_size, train.batch_size if train else None)

    def as_measured(self, point: Point) -> tuple[Point, Point | None]:
        """The point as its inference and its training step (None when it measures none) will run: at its batch,
        or for batch max each at the largest power of two whose predicted peak, with what stays resident beside it
        (`resident_mb`), fits the device memory (batch 1 when none does; the protocol's max_batch, an upper bound,
        when the memory is unknown)."""
        train = point if point.measure_train_step else None
        if point.batch_size != MAX_BATCH:
            return point, train
        if self.memory_mb is None:
            planned = dataclasses.replace(point, batch_size=point.planned_batch)
            return planned, planned if train else None
        return (self._at_largest_fitting(point, "peak_mem_mb"),
                self._at_largest_fitting(point, "train_peak_mem_mb") if train else None)

    def _at_largest_fitting(self, point: Point, memory: str) -> Point:
        fitting = dataclasses.replace(point, batch_size=1)
        batch = 2
        while batch <= point.timing.max_batch:
            candidate = dataclasses.replace(point, batch_size=batch)
            peak = self.model.predict(candidate, memory)
            if peak is None or peak + resident_mb(point, batch, memory == "train_peak_mem_mb") > self.memory_mb:
                break
            fitting, batch = candidate, batch * 2
        return fitting

    def _search_s(self, point: Point, found: Point, target: str) -> float | None:
        """Seconds the max-batch search spends before measuring at `found`: one probe per batch 1, 2, ... up to
        it (experiments/measure/throughput.py); the probe that runs out of memory is not counted. 0 for a point
        with a batch of its own."""
        if point.batch_size != MAX_BATCH:
            return 0.0
        seconds, batch = 0.0, 1
        while batch <= found.batch_size:
            ms = self.model.predict(dataclasses.replace(point, batch_size=batch), target)
            if ms is None:
                return None
            seconds, batch = seconds + protocol_seconds(ms, PROBE_TIMING), batch * 2
        return seconds

    def unknown_reason(self, point: Point) -> str | None:
        """Why `point` has no predicted time (None when it has one), with what would give it one."""
        if self.predict(point).point_s is not None:
            return None
        targets = ["latency_ms", "overhead_s"] + (["train_step_ms"] if point.measure_train_step else [])
        fits = [self.model.fit_for(point, t) for t in targets]
        if any(f is not None and not f.reaches(work(point)) for f in fits):
            group = CostModel.group(point).rstrip("|")
            return (f"{group} was measured at one size only (the calibration kept one point), and one size cannot "
                    "extrapolate to another; memory is the analytic estimate; give --calibrate-from a runs.csv of "
                    "two sizes or more, or a sweep (not a dry run) calibrates as it goes")
        if any(f is None for f in fits):
            group = CostModel.group(point).rstrip("|")
            if _device_here(point.device):
                return (f"no measured row of {group}: the calibration did not reach it within its bound; a sweep "
                        "(not a dry run) calibrates it, or give --calibrate-from a runs.csv of this device")
            return f"no row of {group} (no {point.device} here): give --calibrate-from a runs.csv of that device"
        if point.epochs > 0 and _train_steps(point) is None:
            return ("training time: the recipe sets no train_samples (and the data set's size is not read from an "
                    ".npz), so the steps per epoch are unknown")
        return "training time: no training step of this mixer at the training batch could be predicted"

    def _point_s_without_training(self, point: Point,
                                  measured: tuple[Point, Point | None] | None = None) -> float | None:
        """Wall time of the point less its training; `measured`: `as_measured(point)` where the caller has it."""
        infer, train = measured or self.as_measured(point)
        latency = self.model.predict(infer, "latency_ms")
        overhead = self.model.predict(infer, "overhead_s")
        search = self._search_s(point, infer, "latency_ms")
        if latency is None or overhead is None or search is None:
            return None
        seconds = self.gap_s + overhead + search + protocol_seconds(latency, point.timing)
        if wants_pairing(point):
            beside = self.model.predict(reference_point(infer), "latency_ms")
            seconds += 0.0 if beside is None else paired_seconds(latency, beside, point.timing)
        if train is not None:
            step = self.model.predict(train, "train_step_ms")
            search = self._search_s(point, train, "train_step_ms")
            if step is None or search is None:
                return None
            seconds += search + protocol_seconds(step, point.timing)
            if wants_pairing(point):
                beside = self.model.predict(reference_point(train), "train_step_ms")
                seconds += 0.0 if beside is None else paired_seconds(step, beside, point.timing)
        return seconds

    def _train_base_s(self, point: Point, used: int | None = None) -> float | None:
        steps = _train_steps(point, used)
        if steps is None:
            return None
        count, batch = steps
        step_ms = self.model.predict(dataclasses.replace(point, batch_size=batch), "train_step_ms")
        return None if step_ms is None else count * step_ms / 1e3


# calibration run ---------------------------------------------------------------------------------------------------
def calibration_points(points: list[Point], have: list[tuple[Point, dict]]) -> list[Point]:
    """Two small sizes of each mixer setting that the rows at hand do not already cover with three sizes: the
    smallest and the one half way up its list (never its largest, which may be slow). Until a mixer has three
    sizes of its own, its rates come from one fit pooled over every mixer's rows, and its own fit takes over
    as rows arrive."""
    covered: dict[str, set[int]] = {}
    for point, _ in have:
        covered.setdefault(CostModel.group(point), set()).add(point.tokens * point.batch_size)
    chosen: dict[tuple, Point] = {}
    by_group: dict[tuple, list[Point]] = {}
    train_step = any(q.measure_train_step or q.epochs > 0 for q in points)  # once: per point it was quadratic
    for p in points:
        p = dataclasses.replace(p, epochs=0, dataset="", train="{}", checkpoint_dir="", timing=CALIBRATION_TIMING,
                                batch_size=1, measure_train_step=train_step)
        by_group.setdefault((CostModel.group(p), p.preset, p.overrides), []).append(p)
    for (group, _, _), group_points in by_group.items():
        if len(covered.get(group, ())) >= 3:
            continue
        sizes = sorted({p.tokens: p for p in group_points}.values(), key=lambda p: p.tokens)
        for rank, index in enumerate(sorted({0, len(sizes) // 2})):
            chosen.setdefault(sizes[index].key, (rank, len(chosen), sizes[index]))
    return [p for _, _, p in sorted(chosen.values(), key=lambda c: c[:2])]  # every mixer's smallest first


@dataclass(frozen=True)
class CalibrationJob:
    """What an isolated calibration child gets (isolation reads `memory_limit_mb` from what it runs)."""

    point: Point | None = None
    whole: bool = False  # run the point as a sweep would (build, counting), for the per-point overhead
    memory_limit_mb: int = 0


def calibrate_worker(job: CalibrationJob) -> dict:
    """Runs in an isolated child: measures one calibration point (latency, train step, memory) with a quick
    protocol; the first point of each mixer setting runs whole, as a sweep would, for the per-point overhead
    (build, counting), the others only time and read memory."""
    import torch

    from ..measure.run import DTYPES, build_model, measure_inference, measure_point, measure_train_step

    point = job.point
    try:
        if job.whole:
            row = measure_point(point)
            if row.get("status") != "ok":
                return {"status": "ok", "rows": []}
            timed = protocol_seconds(row["latency_ms"], point.timing)
            if point.measure_train_step:
                timed += protocol_seconds(row["train_step_ms"], point.timing)
            row["overhead_s"] = max(float(row["point_seconds"]) - timed, 0.0)
        else:
            device, dtype = torch.device(point.device), DTYPES[point.dtype]
            model = build_model(point)
            row = measure_inference(model, point, dtype, device)
            if point.measure_train_step:
                row.update(measure_train_step(model, point, dtype, device))
    except Exception:  # noqa: BLE001 - a size that fails here is simply not used to calibrate
        return {"status": "ok", "rows": []}
    keys = ("mixer", "preset", "img_size", "patch_size", "batch_size", "device", "dtype", "overrides")
    return {"status": "ok", "rows": [{"calibration": "1", **{k: getattr(point, k) for k in keys}, **row}]}


def _noop(_: CalibrationJob) -> dict:
    return {"status": "ok"}


def run_calibration(points: list[Point], seconds: float = math.inf) -> tuple[list[dict], float, bool]:
    """Measures `points`, each in its own isolated child, starting none after `seconds` and stopping the one
    running then: a slow size costs its own row only, never the rows measured before it.

    Returns:
        The calibration rows, the seconds one point's process takes to start (measured on a warm fork server, as
        every point but a sweep's first starts), and whether the bound stopped the run before its last point.
    """
    from .isolation import run_isolated

    run_isolated(_noop, CalibrationJob(), 60)  # starts the fork server (torch is imported there, once)
    started = time.perf_counter()
    run_isolated(_noop, CalibrationJob(), 60)
    gap_s = time.perf_counter() - started
    rows, whole_done = [], set()
    started = time.perf_counter()
    for point in points:
        left = seconds - (time.perf_counter() - started)
        if left <= 0:
            return rows, gap_s, True
        group = (CostModel.group(point), point.preset, point.overrides)
        result = run_isolated(calibrate_worker, CalibrationJob(point, whole=group not in whole_done),
                              min(left, CALIBRATION_POINT_LIMIT_S))
        measured = [{k: str(v) for k, v in r.items()} for r in result.get("rows", [])]
        if measured:
            whole_done.add(group)
        rows += measured
        if result.get("status") == "timeout" and left < CALIBRATION_POINT_LIMIT_S:  # the bound stopped it
            return rows, gap_s, True
    return rows, gap_s, False


# where the rows come from ----------------------------------------------------------------------------------------
def _with_overhead(row: dict, protocol: TimingProtocol, point: Point | None = None,
                   searched: bool | None = None) -> tuple[Point, dict]:
    """(point, row) with the row's per-point overhead: its wall time less the timed calls, for cost-only rows
    (`protocol`: how the row was timed; a runs.csv does not record it, so the sweep's own is assumed).

    Args:
        searched: whether the row searched its batch (batch max); None reads it from the row's key columns.
    """
    if searched is None:
        searched = str(row.get("batch_size")) == str(MAX_BATCH)
    point = point or point_from_row(row)
    if row.get("overhead_s") or point.epochs > 0 or not row.get("point_seconds") or not row.get("latency_ms"):
        return point, row
    timed = protocol_seconds(float(row["latency_ms"]), protocol)
    if row.get("train_step_ms"):
        timed += protocol_seconds(float(row["train_step_ms"]), protocol)
    if searched:
        # the max-batch search's probes (a few calls at each batch 1, 2, ... up to the one found) are predicted on
        # their own (`Planner._search_s`); where time grows with the batch, two calls a probe sum to about four
        # calls at the batch found (an estimate: at the launch floor the small batches cost as much as the last)
        timed += 4 * sum(float(row[k]) / 1e3 for k in ("latency_ms", "train_step_ms") if row.get(k))
    return point, {**row, "overhead_s": str(max(float(row["point_seconds"]) - timed, 0.0))}


def _device_here(device: str) -> bool:
    if device == "cpu":
        return True
    import torch

    return torch.cuda.is_available()


def _ok_rows(path: Path, devices: set[str]) -> list[dict]:
    """The current row of each point (a rerun appends a newer one, which replaces it, as in the report) where it
    measured a latency on one of `devices`."""
    try:
        rows = latest_by_key(read_rows(path)).values()
    except (RunsFileError, OSError):
        return []
    return [r for r in rows if r.get("status") == "ok" and r.get("device") in devices and r.get("latency_ms")]


def _describe_devices(rows: list[dict]) -> str:
    names = sorted({r.get("device_name") or r.get("device") for r in rows})
    return "; ".join(names)


def device_memory_mb(points: list[Point], samples: list[tuple[Point, dict]]) -> tuple[float | None, str]:
    """Memory one point may use: the CPU cap or available RAM; the GPU's memory, or the one the calibration
    rows name (e.g. "NVIDIA H100 80GB HBM3"); None where nothing says."""
    device = points[0].device if points else "cpu"
    if device == "cpu":
        cap = min((p.memory_limit_mb for p in points if p.memory_limit_mb), default=0)
        if cap:
            return float(cap), "memory_limit_mb"
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024, "MemAvailable of this machine"
        except OSError:
            pass
        return None, "unknown"
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.total_memory / MiB, props.name
    names = {r.get("device_name", "") for p, r in samples if p.device == device}
    for name in sorted(names):
        match = re.search(r"(\d+)\s*GB", name)
        if match:
            return int(match.group(1)) * 1000**3 / MiB, f"{name} (from the calibration rows)"
    return None, "unknown (no GPU here and no calibration row names its memory)"


# order and budget ------------------------------------------------------------------------------------------------
def bisection_ranks(count: int) -> list[int]:
    """Rank of each of `count` sorted sizes: smallest 0, largest 1, then midpoints breadth first."""
    if count == 0:
        return []
    ranks = [0] * count
    order = [0] if count == 1 else [0, count - 1]
    intervals = [(0, count - 1)]
    while intervals:
        nxt = []
        for lo, hi in intervals:
            if hi - lo < 2:
                continue
            mid = (lo + hi) // 2
            order.append(mid)
            nxt += [(lo, mid), (mid, hi)]
        intervals = nxt
    for rank, index in enumerate(order):
        ranks[index] = rank
    return ranks


def side_by_side_order(points: list[Point], planner: Planner | None) -> list[Point]:
    """`points` with those that run side by side (CPU training, `parallel` > 1) moved after the others, into one
    pool, longest predicted first: a pool per mixer left each mixer's last seed running alone with a core idle,
    and longest-first keeps a long point from starting last (points without a prediction keep their order)."""
    alone = [p for p in points if p.parallel <= 1]
    together = [p for p in points if p.parallel > 1]

    def longest_first(p: Point) -> tuple[int, float]:
        seconds = planner.predict(p).point_s if planner else None
        return -p.parallel, -(seconds or 0.0)

    return alone + sorted(together, key=longest_first)


def budget_order(points: list[Point], predictions: dict[tuple, Prediction]) -> list[Point]:
    """Coarse first: round r runs the rank-r size of every group (smallest, largest that is predicted to fit,
    the middle, then the quarters...). Sizes predicted not to fit come last in their group, ascending, so the
    memory wall is still found when time is left. Training points (one size, expensive) come after the first
    three rounds, when every cost curve has its two ends and middle."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault(point_group(dataclasses.asdict(p)), []).append(p)
    keyed = []
    for index, (group, members) in enumerate(groups.items()):
        members = sorted(members, key=lambda p: (p.tokens, p.img_size))
        fitting = [p for p in members if predictions[p.key].fits is not False]
        too_big = [p for p in members if predictions[p.key].fits is False]
        sizes = sorted({p.tokens for p in fitting})
        rank_of = dict(zip(sizes, bisection_ranks(len(sizes))))
        for p in fitting:
            rank = rank_of[p.tokens] if p.epochs == 0 else 3
            keyed.append(((rank, p.epochs > 0, index, p.tokens, p.img_size), p))
        for offset, p in enumerate(too_big):
            keyed.append(((len(sizes) + offset, p.epochs > 0, index, p.tokens, p.img_size), p))
    return [p for _, p in sorted(keyed, key=lambda kp: kp[0])]


class Budget:
    """Hands out points while their predicted time fits in what is left, each bounded by what is left.

    The first point of a run is always handed out, with its own time limit: a budget smaller than any point (or
    spent on calibration) would otherwise run nothing, and every rerun of the command would stop where the last
    one did. `forced` names that point when the budget alone would have held it back.
    """

    def __init__(self, minutes: float, planner: Planner, started: float) -> None:
        self.deadline = started + minutes * 60.0
        self.planner = planner
        self.held_back: list[Point] = []
        self.original_timeout: dict[tuple, float] = {}
        self.forced: tuple | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def points(self, points: list[Point]) -> Iterator[Point]:
        for point in points:
            left = self.left()
            predicted = self.planner.predict(point).point_s
            overruns = left <= 0 or (predicted is not None and predicted * BUDGET_SLACK > left)
            if not self.original_timeout:  # the run's first point: it runs whatever the budget says
                self.forced = point.key if overruns else None
                self.original_timeout[point.key] = point.timeout_s
                yield point
                continue
            if overruns:
                self.held_back.append(point)
                continue
            self.original_timeout[point.key] = point.timeout_s
            yield dataclasses.replace(point, timeout_s=min(point.timeout_s, left))

    def cut_short(self, point: Point, row: dict) -> bool:
        """True when `row` is a timeout that the budget imposed (not the point's own limit): no row is written,
        so the next run starts this point again."""
        own = self.original_timeout.get(point.key, point.timeout_s)
        return row.get("status") == "timeout" and point.timeout_s < own


# printing -----------------------------------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str) -> str:
    width = int(spec.split(".")[0] or 0)
    return "-".rjust(width) if value is None else format(value, spec)


def plan_lines(planner: Planner, points: list[Point], order: list[Point] | None = None,
               budget_minutes: float | None = None) -> list[str]:
    """The dry-run's table: one line per point in run order, then the totals and what could not be predicted."""
    lines = ["calibration: " + ("; ".join(planner.sources) if planner.sources else
                                "none: this plan is UNCALIBRATED (no rows of this device and no way to measure "
                                "it here); it gives MACs and an analytic memory estimate only")]
    if planner.samples:
        groups = sorted({CostModel.group(p) for p, _ in planner.samples})
        lines.append(f"  fitted per mixer|device|dtype|compile: {', '.join(groups)}")
    lines.append(f"device memory: {_fmt(planner.memory_mb and planner.memory_mb / 1024, '.1f')} GiB "
                 f"({planner.memory_source})")
    # The label comes last, whole: a training point's seed and data set sit at its end.
    lines.append(f"{'#':>4} {'GMACs':>8} {'infer ms':>9} {'train ms':>9} {'peak MiB':>9} {'train MiB':>9} "
                 f"{'fits':>4} {'point s':>8}  point")
    total = 0.0
    from_eager = 0
    reasons: dict[str, int] = {}
    budget_s = budget_minutes * 60 if budget_minutes else None
    cut = None
    for index, point in enumerate(order or points):
        pr = planner.predict(point)
        fits = {True: "yes", False: "NO", None: "?"}[pr.fits]
        if pr.point_s is None:
            reason = planner.unknown_reason(point) or "unknown"
            reasons[reason] = reasons.get(reason, 0) + 1
        else:
            total += pr.point_s / point.parallel  # points run side by side share the wall time
        if budget_s is not None and cut is None and total > budget_s:
            cut = index
            lines.append(f"     --- budget of {budget_minutes:g} min ends about here ---")
        if planner.model.borrows_eager(point, "latency_ms"):
            from_eager += 1
        found = ""
        if point.batch_size == MAX_BATCH:
            found = f" (predicted: b{pr.batch}" + (f", train b{pr.train_batch})" if pr.train_batch else ")")
        lines.append(f"{index + 1:>4} {pr.gmacs:>8.3g} {_fmt(pr.latency_ms, '9.3g')} {_fmt(pr.train_step_ms, '9.3g')} "
                     f"{_fmt(pr.peak_mem_mb, '9.4g')} {_fmt(pr.train_peak_mem_mb, '9.4g')} {fits:>4} "
                     f"{_fmt(pr.point_s, '8.1f')}  {point.label()}{found}")
    unknown = sum(reasons.values())
    if unknown == len(points) and points:
        known = "UNKNOWN: no point could be predicted (reasons below)"
    else:
        known = f"{total / 60:.1f} min" + (f" + {unknown} points NOT PREDICTED (reasons below)" if unknown else "")
    side_by_side = max((p.parallel for p in points), default=1)
    lines.append(f"predicted wall time of the {len(points)} points: {known}"
                 + (" (per-point overheads included; the report at the end is not)" if unknown < len(points) else "")
                 + (f"; training points run up to {side_by_side} at a time, each counted as its share"
                    if side_by_side > 1 else ""))
    lines += [f"  not predicted, {count} point{'s' * (count > 1)}: {reason}" for reason, count in reasons.items()]
    if from_eager:
        lines.append(f"  {from_eager} graphed point{'s' * (from_eager > 1)} predicted from eager rows (no graphed row "
                     "of their mixer yet): an upper bound on time, since a graph replays without eager's launch floor")
    max_points = [p for p in points if p.batch_size == MAX_BATCH]
    if max_points and planner.memory_mb is not None:
        lines.append(f"  {len(max_points)} batch-max point{'s' * (len(max_points) > 1)} predicted at the largest "
                     "power-of-two batch whose predicted peak fits the device memory, with one probe per batch up "
                     "to it")
    elif max_points:
        lines.append(f"  {len(max_points)} batch-max point{'s' * (len(max_points) > 1)} planned at max_batch, an "
                     "upper bound: the device memory is unknown")
    return lines


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"
