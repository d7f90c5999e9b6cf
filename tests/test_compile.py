"""`compile` on the CPU: a compiled point times the compiled model after compiling it, its row is keyed by the mode,
a compile that fails is an error row that says so, one that runs past the point's limit is a timeout row, and a
compiled training trains."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

import experiments.measure.run as run
from experiments.measure.compiled import CACHE_VARIABLE, point_cache_dir
from experiments.measure.point import Point
from experiments.measure.run import measure_point
from experiments.measure.timing import TimingProtocol
from experiments.runs_csv import read_rows
from experiments.sweep.__main__ import main
from experiments.sweep.config import ConfigError, SweepConfig
from experiments.sweep.isolation import run_isolated
from models import create_vit
from tiny_sweep import tiny_config, write_config

QUICK = TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.0)  # no warm-up: compilation must not need one


def compiled_point(**kwargs) -> Point:
    """A micro, one-block attention model at 16 px (16 tokens): the smallest graph inductor compiles."""
    defaults = dict(mixer="attention", preset="micro", img_size=16, patch_size=4, batch_size=2, timing=QUICK,
                    overrides='{"depth":1}', compile="default", measure_train_step=False)
    return Point(**{**defaults, **kwargs})


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def spy_on_timing(monkeypatch) -> list[int]:
    """The number of graphs compiled so far, each time a measurement starts timing."""
    torch._dynamo.reset()
    at_timing: list[int] = []
    time_call = run.time_call

    def spy(fn, device, protocol):
        at_timing.append(graphs_compiled())
        return time_call(fn, device, protocol)

    monkeypatch.setattr(run, "time_call", spy)
    return at_timing


def test_compiled_point_compiles_before_timing_starts(monkeypatch) -> None:
    """With no warm-up at all, the graph is compiled before the first timed call: the latency is the compiled
    model's, not compilation's."""
    at_timing = spy_on_timing(monkeypatch)
    cache_before = os.environ.get(CACHE_VARIABLE)
    row = measure_point(compiled_point())
    assert row["status"] == "ok", row["error"]
    assert row["latency_ms"] > 0 and row["impl"]
    assert at_timing == [graphs_compiled()] and at_timing[0] > 0  # compiled before timing, nothing while timing
    # the point compiled into a cache of its own, removed after it
    assert os.environ.get(CACHE_VARIABLE) == cache_before and not point_cache_dir(os.getpid()).exists()


@pytest.mark.slow  # compiles the training graph (forward and backward) too: about a minute on a busy 2-core machine
def test_compiled_training_step_compiles_before_timing_starts(monkeypatch) -> None:
    """The training step's own graph (train mode, with backward) is compiled before its timing starts too."""
    at_timing = spy_on_timing(monkeypatch)
    row = measure_point(compiled_point(measure_train_step=True))
    assert row["status"] == "ok", row["error"]
    assert row["train_step_ms"] > 0 and row["train_status"] == "ok"
    assert len(at_timing) == 2 and 0 < at_timing[0] < at_timing[1] == graphs_compiled()


@pytest.mark.slow  # the sweep checks compile works, then the point compiles in a fresh worker: over a minute busy
def test_compiled_sweep_row_says_the_mode(tmp_path: Path) -> None:
    """Through the sweep (isolated worker): the row is ok and keyed compile = default, beside nothing eager."""
    config, out = write_config(tmp_path, tiny_config(["attention"], [16])), tmp_path / "out"
    assert main(["--config", str(config), "--out", str(out), "--quiet", "--no-report", "--compile", "default"]) == 0
    rows = read_rows(out / "runs.csv")
    assert [(r["mixer"], r["compile"], r["status"]) for r in rows] == [("attention", "default", "ok")], rows
    assert float(rows[0]["latency_ms"]) > 0 and float(rows[0]["mfu"]) > 0  # MFU against the measured CPU peak


def test_compile_refused_is_an_error_row(monkeypatch) -> None:
    """torch.compile raising when called (a backend that cannot load, say) fails the point with that message."""
    def refuse(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", refuse)
    row = measure_point(compiled_point())
    assert row["status"] == "error"
    assert "torch.compile failed (mode=default)" in row["error"] and "no C++ compiler found" in row["error"]
    assert row["macs_analytic"] > 0  # the cost known without running still fills the row


def test_impossible_mode_is_an_error_row() -> None:
    """A mode torch does not know (the sweep's config refuses it first; a Point built by hand does not)."""
    row = measure_point(compiled_point(compile="fastest-please"))
    assert row["status"] == "error" and "torch.compile failed (mode=fastest-please)" in row["error"]


def test_backend_failing_at_the_first_call_is_an_error_row(monkeypatch) -> None:
    """Compilation is lazy: inductor failing at the first call is a compile failure, not a latency."""
    import torch._inductor.compile_fx as compile_fx

    def fail(*args, **kwargs):
        raise RuntimeError("C++ compile error: cc1plus killed")

    torch._dynamo.reset()
    monkeypatch.setattr(compile_fx, "compile_fx", fail)
    row = measure_point(compiled_point())
    torch._dynamo.reset()  # drop what the failed compile left cached for this model's code
    assert row["status"] == "error" and row.get("latency_ms") is None
    assert "torch.compile failed (mode=default)" in row["error"] and "cc1plus killed" in row["error"]


def _compile_hangs(point: Point) -> dict:
    """The point, in its worker, with an inductor that starts writing a kernel to its cache and never finishes."""
    import torch._inductor.compile_fx as compile_fx

    def hang(*args, **kwargs):
        cache = Path(os.environ[CACHE_VARIABLE])
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "kernel.so").write_bytes(b"")  # what a kill mid-write leaves: a truncated shared object
        time.sleep(600)

    compile_fx.compile_fx = hang
    return measure_point(point)


def test_compile_past_the_time_limit_is_a_timeout_row() -> None:
    """A timeout row, and the killed point's half-written inductor cache is removed, so no later point loads it."""
    caches = set(Path(point_cache_dir(0)).parent.glob("mixerbench-inductor-*"))
    started = time.perf_counter()
    # 10 s: the worker builds the model and traces it within that even on a busy machine; compiling never ends
    row = run_isolated(_compile_hangs, compiled_point(), timeout_s=10)
    assert row["status"] == "timeout" and "no result within 10 s" in row["error"]
    assert time.perf_counter() - started < 60
    assert set(Path(point_cache_dir(0)).parent.glob("mixerbench-inductor-*")) <= caches


def test_a_compiled_training_is_accepted() -> None:
    """Every training runs through the device trainer, which compiles the forward it trains (the slow test below):
    a compiled key is true of the training too, so the config takes it."""
    SweepConfig(epochs=1, dataset="pathfinder", compile="default")._check_training()


@pytest.mark.slow  # compiling the training and evaluation graphs takes about a minute on a busy 2-core machine
def test_compiled_training_trains() -> None:
    from test_device_trainer import RECIPE, splits, tiny_vit, weights

    from experiments.train.device_trainer import train_on_device

    torch._dynamo.reset()
    model = tiny_vit()
    before = weights(model)
    run_ = train_on_device(model, *splits(), RECIPE, dtype=torch.float32, seed=0, compile_mode="default")
    assert run_.result.status == "ok", run_.result.error
    assert graphs_compiled() > 0
    assert any(not torch.equal(before[k], v) for k, v in weights(model).items())
    assert run_.result.accuracy is not None and 0 <= run_.result.accuracy <= 1


@pytest.mark.parametrize("mixer", ["swin", "neighborhood", "vmamba"])
def test_compiled_training_after_a_compiled_inference_under_inference_mode(mixer: str) -> None:
    """A cost point runs the compiled forward under inference_mode, then the compiled training step on the same
    model: the per-grid tensors the first cached (swin's mask and index, neighborhood's tiles) came out of an
    inference-mode graph, and the training graph could not save them for backward (`mixers.base.grid_cached`);
    vmamba's scan orders are built in its graphs."""
    torch._dynamo.reset()
    model = create_vit("micro", mixer=mixer, img_size=32, patch_size=8, depth=1, num_classes=4)
    compiled = torch.compile(model)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.inference_mode():
        compiled(x)
    model.train()
    torch.nn.functional.cross_entropy(compiled(x), torch.tensor([0, 1])).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
