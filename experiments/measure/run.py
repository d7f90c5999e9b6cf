"""Measures one point in the current process: parameters, MACs (three ways), latency, peak memory, training.

Called inside an isolated worker (experiments/sweep/isolation.py), so an out-of-memory or a crash costs one point.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from collections.abc import Callable
from contextlib import nullcontext

import torch

from models import ViT, create_vit

from ..schema import MAX_BATCH
from . import graphed
from .calls import forward_call, random_images, train_step_calls
from .compiled import compile_model, compiled_first_call, own_inductor_cache
from .counting import flop_counter_flops, flop_counter_train_flops, fvcore_macs
from .memory import MiB, PeakMemory, peak_memory
from .oom import is_out_of_memory
from .paired import measure_paired
from .point import Point, reference_point, wants_pairing
from .provenance import provenance
from .rates import add_rates
from .throughput import PROBE_TIMING, at_max_batch
from .timing import Timing, time_call

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Fault injection for tests: a point whose label (`Point.label()`) matches this regular expression fails as a
# point would, with status error. Read in the worker, so a sweep started with it set fails those points in every
# run; never set outside tests (tests/test_faults.py).
FAULT_VARIABLE = "MIXERBENCH_FAULT"
ERF_IMAGES = 64  # test images the effective receptive field maps average over
# A measurement's one-line note for the row's error column (the row stays ok): merged by `_merge_result`.
NOTE = "_note"


def build_model(point: Point, *, num_classes: int = 1000, in_chans: int = 3, device: str | None = None) -> ViT:
    overrides = json.loads(point.overrides)
    mixer_options = overrides.pop("mixer_options", None)
    with torch.device(device or point.device):
        return create_vit(
            point.preset,
            mixer=point.mixer,
            img_size=point.img_size,
            patch_size=point.patch_size,
            num_classes=num_classes,
            in_chans=in_chans,
            mixer_options=mixer_options,
            **overrides,
        )


def describe(point: Point, model: ViT) -> dict[str, object]:
    """Columns known before anything runs."""
    return {
        "tokens": model.tokens,
        "grid_h": model.grid[0],
        "grid_w": model.grid[1],
        "dim": model.config.dim,
        "depth": model.config.depth,
        "num_heads": model.config.num_heads,
        "mlp_ratio": model.config.mlp_ratio,
        "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "macs_analytic": model.macs(),
    }


def count_on_meta(point: Point, in_chans: int, num_classes: int) -> int:
    """FlopCounterMode FLOPs for one image on the meta device: no memory, so even out-of-memory points get it."""
    model = build_model(point, num_classes=num_classes, in_chans=in_chans, device="meta").eval()
    example = torch.empty(1, in_chans, point.img_size, point.img_size, device="meta")
    return flop_counter_flops(model, example)


def count_train_on_meta(point: Point, in_chans: int, num_classes: int) -> int | None:
    """FlopCounterMode FLOPs of one image's training step (forward and backward) on the meta device, so what
    the backward recomputes (attention's softmax) is counted, not guessed; None where an op has no meta kernel."""
    model = build_model(point, num_classes=num_classes, in_chans=in_chans, device="meta").train()
    example = torch.empty(1, in_chans, point.img_size, point.img_size, device="meta")
    try:
        return flop_counter_train_flops(model, example, torch.zeros(1, dtype=torch.long, device="meta"))
    except (RuntimeError, NotImplementedError):
        return None


def measure_inference(model: ViT, point: Point, dtype: torch.dtype, device: torch.device,
                      batch: int | None = None) -> dict[str, object]:
    """Latency, throughput and peak memory of one forward at `batch` (default: the point's), timed in the point's
    `timing_mode`; memory is read from an eager call in both modes."""
    batch = batch or point.batch_size
    x = random_images(model, batch, device, dtype)
    forward = forward_call(model, x)
    compiled_first_call(forward, point, lambda error: is_out_of_memory(error, bool(point.memory_limit_mb)))
    timing = _time_in_mode(forward, point, device)
    memory, note = _memory_after_timing(forward, point, device)
    result: dict[str, object] = {
        "latency_ms": timing.median_ms,
        "latency_iqr_ms": timing.iqr_ms,
        "latency_repeats": timing.repeats,
        "latency_calls_per_sample": timing.calls_per_sample,
        "batch_used": batch,
        "throughput_img_s": batch / (timing.median_ms / 1e3),
        "impl": model.impl,
    }
    if memory is None:
        return {**result, NOTE: note}
    resident = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers(), x))
    return {
        **result,
        "peak_mem_mb": memory.allocated_mb,
        # CUDA's allocator counts everything the process holds; on a CPU, weights and input are added by hand.
        "peak_mem_total_mb": memory.total_mb if memory.total_mb is not None
        else memory.allocated_mb + resident / MiB,
        "peak_mem_reserved_mb": memory.reserved_mb,
        "memory_method": memory.method,
    }


def _time_in_mode(call: Callable[[], object], point: Point, device: torch.device,
                  before_capture: Callable[[], object] | None = None, warmup: Callable[[], object] | None = None
                  ) -> Timing:
    """`call` timed in the point's regime: eager, or replayed from a CUDA graph that is freed with its private
    pool before this returns, so the memory pass after it neither shares the device with the pool nor is
    counted against it."""
    if point.timing_mode != "graphed":
        return time_call(call, device, point.timing)
    replay = graphed.capture(call, device, warmup=warmup, before_capture=before_capture)
    try:
        return time_call(replay, device, point.timing)
    finally:
        del replay  # the graph and its pool go with the last reference
        _free(device)


def _memory_after_timing(call: Callable[[], object], point: Point, device: torch.device
                         ) -> tuple[PeakMemory | None, str]:
    """The eager memory pass after the timing: (its peak, ""), or (None, a note) when it runs out of memory at a
    fixed batch, so a latency already measured is kept. At batch `max` the out-of-memory is raised: the search
    halves the batch instead.

    Graphed, the timing ran the call only on the capture's side stream and in the graph: one eager call first
    allocates what the first call on this stream allocates (cuBLAS's workspace, 32 MiB on Hopper), before the
    baseline, as the eager regime's warm-up does.
    """
    try:
        if point.timing_mode == "graphed":
            call()
        return peak_memory(call, device), ""
    except Exception as error:  # noqa: BLE001
        if point.batch_size == MAX_BATCH or not is_out_of_memory(error, bool(point.memory_limit_mb)):
            raise
    _free(device)
    return None, "memory pass: out of memory after the timing (peak memory left empty)"


def measure_train_step(model: ViT, point: Point, dtype: torch.dtype, device: torch.device,
                       batch: int | None = None) -> dict[str, object]:
    """One optimizer step on random data (experiments/measure/calls.py), timed in the point's regime.

    Graphed, the step is captured whole (forward, backward, AdamW), as PyTorch's whole-network capture recipe
    does: gradients set to None before capture, so each replay rewrites them. A step that cannot be captured
    raises `graphed.GraphUnavailable`.
    """
    batch = batch or point.batch_size
    calls = train_step_calls(model, dtype, device, batch, graphed=point.timing_mode == "graphed")
    step = calls.step
    if point.timing_mode == "graphed":
        timing = _time_in_mode(calls.forward_backward, point, device, warmup=step, before_capture=calls.zero_grad)
    else:
        # training mode compiles a graph of its own (forward and backward)
        compiled_first_call(step, point, lambda error: is_out_of_memory(error, bool(point.memory_limit_mb)))
        timing = _time_in_mode(step, point, device)  # warm-up also creates the optimizer state
    memory, note = _memory_after_timing(step, point, device)
    return {
        "train_step_ms": timing.median_ms,
        "train_step_iqr_ms": timing.iqr_ms,
        "train_batch_used": batch,
        "train_throughput_img_s": batch / (timing.median_ms / 1e3),
        "train_peak_mem_mb": memory.allocated_mb if memory is not None else None,
        **({NOTE: f"train step: {note}"} if note else {}),
    }


def _at_batch(measure: Callable[..., dict[str, object]], model: ViT, point: Point, dtype: torch.dtype,
              device: torch.device) -> dict[str, object]:
    """`measure` at the point's batch, or at the largest that fits for batch size max (experiments/measure/
    throughput.py: a probe is one untimed call of the same measurement, with one repeat)."""
    if point.batch_size != MAX_BATCH:
        return measure(model, point, dtype, device)
    probe_point = dataclasses.replace(point, timing=PROBE_TIMING)
    _, row = at_max_batch(lambda batch: measure(model, point, dtype, device, batch),
                          lambda batch: measure(model, probe_point, dtype, device, batch),
                          point.timing.max_batch, lambda: _free(device))
    return row


def train_point(point: Point, device: torch.device, dtype: torch.dtype,
                train_flops_per_image: float | None = None) -> dict[str, object]:
    """Trains a fresh model on the point's data set and evaluates it (experiments/train/device_trainer.py).

    The learning curve goes to `point.curve_path` as it is taken; `train_flops_per_image` (the row's
    `train_flops_counted`) turns its samples into training FLOPs. A data set with test buckets (reach) also gets
    its accuracy per bucket, as JSON in `accuracy_by_bucket`. With `point.erf_path`, the effective receptive field
    maps at initialisation and after training are saved there (experiments/train/erf.py); with
    `point.weights_path`, the trained weights (experiments/train/weights.py).
    """
    from ..schema import KEY_COLUMNS
    from ..train.datasets import build_dataset
    from ..train.device_data import fresh_on_device, to_device
    from ..train.device_trainer import train_on_device
    from ..train.recipe import TrainRecipe

    recipe = TrainRecipe(epochs=point.epochs, **json.loads(point.train))
    # rand_augment="": the training loop augments by random crop and flip on the device, and nothing else.
    bundle = build_dataset(
        point.dataset, img_size=point.img_size, data_dir=point.data_dir or None,
        data_path=point.data_path or None, seed=point.seed, train_samples=recipe.train_samples,
        patch_size=point.patch_size, rand_augment="",
    )
    torch.manual_seed(point.seed)
    model = build_model(point, num_classes=bundle.num_classes, in_chans=bundle.in_chans)
    key = {column: getattr(point, column) for column in KEY_COLUMNS if hasattr(point, column)}
    erf_maps = {}
    if point.erf_path:
        from ..train.erf import erf_map

        erf_images = torch.stack([bundle.test[i][0] for i in range(min(ERF_IMAGES, len(bundle.test)))]).to(device)
        erf_maps["init"] = erf_map(model.to(device), erf_images)
    train, test, view = to_device(bundle.train, bundle.test, device)
    run = train_on_device(
        model, train, test, view, recipe, dtype=dtype, seed=point.seed,
        checkpoint_dir=Path(point.checkpoint_dir) if point.checkpoint_dir else None, compile_mode=point.compile,
        fresh_train=fresh_on_device(bundle.fresh_train, device), train_buckets=bundle.train_buckets,
        test_buckets=bundle.test_buckets, curve_path=Path(point.curve_path) if point.curve_path else None,
        curve_key=key, flops_per_sample=train_flops_per_image,
    )
    result = run.result
    row = {**run.to_row(), "lr": recipe.lr, "lr_stage": point.lr_stage, "lr_source": point.lr_source}
    row["status"] = result.status
    if result.error:
        row["error"] = result.error
    if result.status == "ok" and run.accuracy_by_bucket:
        row["accuracy_by_bucket"] = json.dumps({k: round(v, 5) for k, v in run.accuracy_by_bucket.items()})
    if point.weights_path and result.status == "ok":
        from ..train.weights import save_weights

        save_weights(Path(point.weights_path), model, key, num_classes=bundle.num_classes, in_chans=bundle.in_chans,
                     mean=bundle.mean, std=bundle.std)
    if erf_maps and result.status == "ok":
        from ..train.erf import erf_map, save_erf

        erf_maps["trained"] = erf_map(model, erf_images)
        save_erf(Path(point.erf_path), erf_maps, key, point.patch_size)
    return row


def _train_step_or_oom(model: ViT, point: Point, dtype: torch.dtype, device: torch.device, row: dict) -> str:
    """Measures the training step into `row`; returns the out-of-memory message instead of raising one."""
    try:
        _merge_result(row, _at_batch(measure_train_step, model, point, dtype, device))
        row["train_status"] = "ok"
        return ""
    except graphed.GraphUnavailable as error:  # the inference stands; the step's row says why it has no time
        row["train_status"], row["error"] = "error", f"train step: {error}"
        return ""
    except Exception as error:  # noqa: BLE001
        if not is_out_of_memory(error, bool(point.memory_limit_mb)):
            raise
        return _first_line(error, 400)


def _paired_or_note(timed: ViT, point: Point, dtype: torch.dtype, device: torch.device, row: dict) -> None:
    """The point's timings over the reference mixer's, timed alternately (experiments/measure/paired.py), into
    `row`; where that fails (the reference's compile, memory), the row keeps its own timings and says why."""
    try:
        torch.manual_seed(point.seed)
        reference = build_model(reference_point(point))
        _merge_result(row, measure_paired(timed, reference, point, dtype, device, row))
    except Exception as error:  # noqa: BLE001 - the point's own measurements stand
        _merge_result(row, {NOTE: f"paired timing beside {point.paired_reference}: {_first_line(error, 300)}"})
        _free(device)


def _first_line(error: BaseException, limit: int) -> str:
    """`Type: message` of `error`, its first line, at most `limit` characters: what a row's `error` holds."""
    return f"{type(error).__name__}: {error}".splitlines()[0][:limit]


def _merge_result(row: dict, result: dict[str, object]) -> None:
    """Puts a measurement's columns into `row`, its note (if any) after the notes already there."""
    result = dict(result)
    note = result.pop(NOTE, "")
    row.update(result)
    if note:
        row["error"] = "; ".join(filter(None, [row.get("error", ""), note]))


def _free(device: torch.device) -> None:
    """Returns cached blocks after an out-of-memory, outside the except block that held the failed frames."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _count_fvcore_or_note(model: ViT, device: torch.device, row: dict, memory_limited: bool = False) -> None:
    """fvcore's MACs for one image, traced in float32 on the point's device.

    The trace runs a real forward, which can need more memory than the measured one (float32, and after the
    training step): running out there leaves `macs` empty with a note, and the latency already measured stands.
    """
    try:
        with torch.no_grad():
            example = torch.randn(1, model.in_chans, *model.img_size, device=device)
            row["macs"] = fvcore_macs(model.eval().float(), example)
    except Exception as error:  # noqa: BLE001
        if not is_out_of_memory(error, memory_limited):
            raise
        row["error"] = "; ".join(filter(None, [row["error"], "fvcore count: out of memory (macs left empty)"]))
        _free(device)


def describe_without_running(point: Point) -> dict[str, object]:
    """The columns known from the configuration alone (a meta-device model: no memory), for rows of points
    that never reported (killed, timed out, skipped)."""
    try:
        row = describe(point, build_model(point, device="meta"))
    except Exception:  # noqa: BLE001 - a point that cannot even be built has its own error row
        return {"tokens": point.tokens}
    row["gmacs"] = row["macs_analytic"] / 1e9
    row["gflops"] = 2 * row["gmacs"]
    return row


def _inject_fault(point: Point) -> None:
    """Raises for a point that `FAULT_VARIABLE` names (tests only)."""
    pattern = os.environ.get(FAULT_VARIABLE)
    if pattern and re.search(pattern, point.label()):
        raise RuntimeError(f"fault injected by {FAULT_VARIABLE}={pattern}")


def measure_point(point: Point) -> dict[str, object]:
    """Produces the row for `point`; never raises for a failure of the point itself (it becomes the status).

    A compiled point compiles into an inductor cache of its own (experiments/measure/compiled.py says why).
    """
    with own_inductor_cache() if point.compile else nullcontext():
        return _measure_point(point)


def _measure_point(point: Point) -> dict[str, object]:
    started = time.perf_counter()
    if point.num_threads:
        torch.set_num_threads(point.num_threads)
    device = torch.device(point.device)
    dtype = DTYPES[point.dtype]
    row: dict[str, object] = {"status": "ok", "error": ""}
    try:
        _inject_fault(point)
        torch.manual_seed(point.seed)
        model = build_model(point)
        row.update(describe(point, model))
        row["flops_counted"] = count_on_meta(point, model.in_chans, model.num_classes)
        if point.measure_train_step:
            row["train_flops_counted"] = count_train_on_meta(point, model.in_chans, model.num_classes)
        # A compiled module wraps the model and shares its parameters; an untimed first call absorbs compilation.
        timed = compile_model(model, point.compile) if point.compile else model
        _merge_result(row, _at_batch(measure_inference, timed, point, dtype, device))
        if point.measure_train_step:
            train_oom = _train_step_or_oom(timed, point, dtype, device, row)
            if train_oom:  # inference results stand; the training wall is its own data point
                row["train_status"], row["error"] = "oom", f"train step: {train_oom}"
                _free(device)
        _count_fvcore_or_note(model, device, row, bool(point.memory_limit_mb))
        if wants_pairing(point):
            _paired_or_note(timed, point, dtype, device, row)
        in_chans, num_classes = model.in_chans, model.num_classes
        del model
        if point.epochs > 0:
            # The curve counts training FLOPs per image as the cost rows do, also where the step was not timed.
            flops = row.get("train_flops_counted") or count_train_on_meta(point, in_chans, num_classes)
            row.update(train_point(point, device, dtype, flops))
    except Exception as error:  # noqa: BLE001 - any failure of this point is recorded, never raised
        row["status"] = "oom" if is_out_of_memory(error, bool(point.memory_limit_mb)) else "error"
        row["error"] = _first_line(error, 500)
    if "macs_analytic" in row:  # known even past the memory wall, so cost curves continue there
        row["gmacs"] = row["macs_analytic"] / 1e9
        row["gflops"] = 2 * row["gmacs"]
    row.update(add_rates(row, point.device_peak_tflops))
    row.update(provenance(device))
    row["point_seconds"] = time.perf_counter() - started
    return row
