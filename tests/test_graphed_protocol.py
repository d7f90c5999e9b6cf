"""The graphed regime's own logic on the CPU, with torch.cuda's graph API replaced by fakes: the graph and its
pool are freed before the eager memory pass, that pass warms up before its baseline, an out-of-memory in it keeps
the latency already measured, and a training step is captured with its gradients set to None (issue 34, items
3-5)."""
from __future__ import annotations

import contextlib
import weakref

import pytest
import torch

from experiments.measure import graphed, run
from experiments.measure.memory import PeakMemory
from experiments.measure.point import Point
from experiments.measure.timing import TimingProtocol
from experiments.train.device_trainer import make_optimizer
from experiments.train.recipe import TrainRecipe

QUICK = TimingProtocol(warmup=0, min_repeats=2, min_time_s=0.0)
TINY = dict(mixer="attention", preset="micro", img_size=16, patch_size=8, overrides='{"depth":1}')
# What the caching allocator raises (c10/cuda/CUDACachingAllocator.cpp), as a user's GPU printed it.
CUDA_OOM = ("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
            "1.12 GiB is free. Including non-PyTorch memory, this process has 78.06 GiB memory in use. Of the "
            "allocated memory 76.40 GiB is allocated by PyTorch, and 1.01 GiB is reserved by PyTorch but "
            "unallocated.")


class Stream:
    def wait_stream(self, other: "Stream") -> None:
        pass


class FakeCuda:
    """torch.cuda's graph API as `graphed.capture` uses it, recording what happens in `events`: the capture runs
    the call once (as a real capture records it), a replay is a recorded no-op, and the graph's release is seen
    through a weak reference."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, events: list[str], params: list[torch.nn.Parameter]):
        self.events, self.params, self.graphs = events, params, []
        fake = self

        class Graph:
            def __init__(self) -> None:
                fake.graphs.append(weakref.finalize(self, events.append, "graph freed"))

            def replay(self) -> None:
                events.append("replay")

        @contextlib.contextmanager
        def graph(_graph: Graph):
            events.append("capture" + (" with grads" if any(p.grad is not None for p in params) else ""))
            yield

        monkeypatch.setattr(graphed, "check_graphable", lambda device: None)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device: Stream())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device: Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)


def _model_recording_forwards(events: list[str]):
    torch.manual_seed(0)
    model = run.build_model(Point(**TINY, batch_size=1))
    forward = model.forward
    model.forward = lambda x: (events.append("forward"), forward(x))[1]
    return model


def _recording_peak_memory(events: list[str], raises: BaseException | None = None):
    def peak_memory(fn, device) -> PeakMemory:
        events.append("baseline")
        if raises is not None:
            raise raises
        fn()
        return PeakMemory(allocated_mb=1.0, reserved_mb=2.0, method="cuda_allocator", total_mb=3.0)

    return peak_memory


def test_graph_is_freed_and_the_memory_pass_warms_up_before_its_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 3: the eager memory pass never shares the device with the graph's pool. Item 4: an eager call on this
    stream first, so what its first call allocates (cuBLAS's workspace) sits below the baseline."""
    events: list[str] = []
    model = _model_recording_forwards(events)
    FakeCuda(monkeypatch, events, list(model.parameters()))
    monkeypatch.setattr(run, "peak_memory", _recording_peak_memory(events))
    result = run.measure_inference(model, Point(**TINY, batch_size=1, timing=QUICK, timing_mode="graphed"),
                                   torch.float32, torch.device("cpu"))
    assert result["latency_ms"] >= 0 and result["peak_mem_mb"] == 1.0
    after_timing = events[events.index("graph freed") - 1:]
    assert after_timing == ["replay", "graph freed", "forward", "baseline", "forward"]
    assert events.count("capture") == 1 and "replay" not in events[:events.index("capture")]


@pytest.mark.parametrize("measure_train_step", [False, True])
def test_memory_pass_out_of_memory_keeps_the_measured_latency(monkeypatch: pytest.MonkeyPatch,
                                                               measure_train_step: bool) -> None:
    """An out-of-memory after the timing leaves the peak empty with a one-line note; the row stays ok."""
    events: list[str] = []
    monkeypatch.setattr(run, "peak_memory", _recording_peak_memory(events, torch.cuda.OutOfMemoryError(CUDA_OOM)))
    build = run.build_model
    monkeypatch.setattr(run, "build_model", lambda *a, **k: FakeCuda(monkeypatch, events, list(
        (model := build(*a, **k)).parameters())) and model)
    row = run.measure_point(Point(**TINY, batch_size=2, timing=QUICK, timing_mode="graphed",
                                  measure_train_step=measure_train_step))
    assert row["status"] == "ok", row["error"]
    assert row["latency_ms"] > 0 and "peak_mem_mb" not in row
    assert "memory pass: out of memory after the timing" in row["error"] and "\n" not in row["error"]
    if measure_train_step:
        assert row["train_step_ms"] > 0 and row["train_peak_mem_mb"] is None
        assert "train step: memory pass: out of memory" in row["error"]


def test_memory_pass_out_of_memory_at_batch_max_halves_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """At batch max the memory pass is part of fitting: its out-of-memory makes the search take a smaller batch."""
    def peak_memory(fn, device) -> PeakMemory:
        fn()
        if run_batch[-1] > 2:
            raise torch.cuda.OutOfMemoryError(CUDA_OOM)
        return PeakMemory(allocated_mb=1.0, reserved_mb=None, method="cpu_profiler")

    run_batch: list[int] = []
    measure = run.measure_inference
    monkeypatch.setattr(run, "measure_inference", lambda model, point, dtype, device, batch=None: (
        run_batch.append(batch or point.batch_size), measure(model, point, dtype, device, batch))[1])
    monkeypatch.setattr(run, "peak_memory", peak_memory)
    row = run.measure_point(Point(**TINY, batch_size=0, measure_train_step=False,
                                  timing=TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.0, max_batch=8)))
    assert row["status"] == "ok", row["error"]
    assert row["batch_used"] == 2 and row["peak_mem_mb"] == 1.0


def test_training_step_is_captured_with_its_gradients_set_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 5: PyTorch's whole-network recipe sets grads to None before capture, so backward allocates each
    `.grad` in the graph's pool and every replay rewrites it; captured after the warm-up left them allocated,
    every replay would add into them."""
    events: list[str] = []
    model = _model_recording_forwards(events)
    FakeCuda(monkeypatch, events, list(model.parameters()))
    result = run.measure_train_step(model, Point(**TINY, batch_size=2, timing=QUICK, timing_mode="graphed"),
                                    torch.float32, torch.device("cpu"))
    assert "capture" in events and "capture with grads" not in events
    assert events.index("graph freed") < len(events) - 1  # the memory pass ran after the graph went
    assert result["train_step_ms"] >= 0 and result["train_peak_mem_mb"] > 0


@pytest.mark.parametrize("message", ["CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                                     "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"])
def test_a_library_allocation_failure_in_capture_stays_an_out_of_memory(monkeypatch: pytest.MonkeyPatch,
                                                                         message: str) -> None:
    """Raised inside the capture, a CUDA library's allocation failure is an out-of-memory the batch-max search
    halves on, not a `GraphUnavailable` that would end the point as an error (items 3 and 9)."""
    FakeCuda(monkeypatch, [], [])

    @contextlib.contextmanager
    def graph_out_of_memory(_graph):
        raise RuntimeError(message)
        yield

    monkeypatch.setattr(torch.cuda, "graph", graph_out_of_memory)
    with pytest.raises(RuntimeError, match="ALLOC_FAILED") as error:
        graphed.capture(lambda: None, torch.device("cpu"))
    assert not isinstance(error.value, graphed.GraphUnavailable)


def test_the_cpu_training_step_times_the_fused_adamw_the_trainers_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU the cost step's AdamW is the trainers' fused one, not PyTorch's per-parameter loop (its CPU
    default) nor the foreach one, which charge a mixer for the number of tensors its parameters come in."""
    made: list[torch.optim.AdamW] = []

    class Recorded(torch.optim.AdamW):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(torch.optim, "AdamW", Recorded)
    model = run.create_vit("micro", mixer="attention", img_size=16, patch_size=8, depth=1)
    result = run.measure_train_step(model, Point(**TINY, batch_size=2, timing=QUICK), torch.float32,
                                    torch.device("cpu"))
    assert result["train_step_ms"] > 0
    assert [(o.defaults["fused"], o.defaults["foreach"]) for o in made] == [(True, None)]
    trainers = make_optimizer(model, TrainRecipe(epochs=1), torch.device("cpu")).defaults
    assert (trainers["fused"], trainers["foreach"]) == (True, None)
