"""The instrument: MAC counters reconcile, memory and timing follow their protocol, failures become rows."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torch.utils.flop_counter import FlopCounterMode

from experiments.measure.counting import flop_counter_flops, fvcore_macs
from experiments.measure.memory import cpu_peak_bytes, peak_memory
from experiments.measure.point import Point
from experiments.measure.run import measure_point
from experiments.measure.timing import TimingProtocol, time_call
from experiments.schema import COLUMNS, KEY_COLUMNS
from experiments.sweep.isolation import run_isolated
from mixers import list_mixers
from models import create_vit

REPO = Path(__file__).resolve().parent.parent

QUICK = TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.0)


@pytest.mark.parametrize("mixer", list_mixers())
@pytest.mark.parametrize("img_size,patch_size", [(16, 4), (28, 4), (36, 4), (32, 2)])
def test_counted_macs_agree_with_analytic(mixer: str, img_size: int, patch_size: int) -> None:
    """fvcore (with our handles) and FlopCounterMode / 2 each within 1% of model.macs(), at every grid."""
    model = create_vit("micro", mixer=mixer, img_size=img_size, patch_size=patch_size, depth=2).eval()
    example = torch.randn(1, 3, img_size, img_size)
    analytic = model.macs()
    assert fvcore_macs(model, example) == pytest.approx(analytic, rel=0.01)
    assert flop_counter_flops(model, example) / 2 == pytest.approx(analytic, rel=0.01)


class OnlySDPA(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(x, x, x)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "MATH"])
def test_flop_counter_counts_every_cpu_sdpa_kernel(device: str, backend: str) -> None:
    """Each SDPA kernel a CPU run can take counts QK^T and AV, on real tensors as on meta, whatever the torch release.

    torch 2.14.1 had no formula for the CPU flash kernel and counted it as 0 FLOPs on real tensors
    (mixers/flop_formulas.py registers one).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import mixers  # noqa: F401  (registers the formulas a release lacks)

    b, h, n, m, d, dv = 2, 3, 17, 11, 8, 8  # the CPU flash kernel needs equal head sizes of k and v
    q = torch.randn(b, h, n, d, device=device)
    k, v = torch.randn(b, h, m, d, device=device), torch.randn(b, h, m, dv, device=device)
    with torch.no_grad(), sdpa_kernel(getattr(SDPBackend, backend)), FlopCounterMode(display=False) as counter:
        F.scaled_dot_product_attention(q, k, v)
    assert counter.get_total_flops() == 2 * b * h * n * m * (d + dv)


def test_flop_counter_counts_cpu_flash_backward() -> None:
    """The CPU flash kernel's backward counts as torch counts the other flash kernels' backward: the scores
    recomputed plus four matmuls, 2.5 x the forward for equal head sizes."""
    import mixers  # noqa: F401

    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        with FlopCounterMode(display=False) as counter:
            F.scaled_dot_product_attention(q, q, q).sum().backward()
    forward = 2 * 2 * 16 * 16 * (8 + 8)
    assert counter.get_total_flops() == forward + forward * 5 // 2


def test_sdpa_handle_fires() -> None:
    """fvcore alone reports 0 for a model whose only matmul is SDPA; with our handle it counts QK^T and AV."""
    b, h, n, d = 2, 3, 17, 8
    assert fvcore_macs(OnlySDPA(), torch.randn(b, h, n, d)) == 2 * b * h * n * n * d


def test_cpu_peak_sees_allocations() -> None:
    def allocate() -> None:
        a = torch.empty(1 << 20, dtype=torch.uint8)
        b = torch.empty(2 << 20, dtype=torch.uint8)
        del a
        c = torch.empty(3 << 20, dtype=torch.uint8)
        del b, c

    assert cpu_peak_bytes(allocate) == 5 << 20  # b and c alive together, a already freed


def test_materialised_attention_peaks_higher() -> None:
    """The N x N matrices of attention_naive show in the measured peak; SDPA's CPU flash kernel avoids them."""
    peaks = {}
    for mixer in ("attention", "attention_naive"):
        model = create_vit("micro", mixer=mixer, img_size=128, patch_size=2, depth=1).eval()
        x = torch.randn(1, 3, 128, 128)
        with torch.inference_mode():
            peaks[mixer] = peak_memory(lambda: model(x), torch.device("cpu")).allocated_mb
    n = 64 * 64
    assert peaks["attention_naive"] - peaks["attention"] >= 2 * n * n * 4 / 2**20 * 0.9  # one head's scores at least


def test_timing_reaches_count_and_time() -> None:
    calls = []
    timing = time_call(lambda: calls.append(1), torch.device("cpu"), TimingProtocol(warmup=2, min_repeats=4, min_time_s=0))
    assert timing.repeats == 4 and len(calls) == 6
    timing = time_call(lambda: time.sleep(0.01), torch.device("cpu"), TimingProtocol(warmup=0, min_repeats=1, min_time_s=0.05))
    # sleep(0.01) oversleeps on a busy machine, so fewer than 5 may reach 0.05 s; more than the minimum of 1 must
    assert timing.repeats >= 2 and timing.median_ms >= 10 and timing.iqr_ms >= 0
    assert timing.repeats * timing.median_ms >= 50 * 0.8


def point(**kwargs) -> Point:
    defaults = dict(mixer="attention", preset="micro", img_size=16, patch_size=4, batch_size=2, timing=QUICK)
    return Point(**{**defaults, **kwargs})


@pytest.mark.parametrize("mixer", list_mixers())
def test_a_measured_row_is_complete(mixer: str) -> None:
    row = measure_point(point(mixer=mixer, device_peak_tflops=1.0))  # the sweep's calibration, given here
    assert row["status"] == "ok", row["error"]
    unfilled = [c for c in COLUMNS if c not in KEY_COLUMNS and row.get(c) in (None, "")]
    expected_empty = {"error", "peak_mem_reserved_mb", "cuda_version", "train_samples", "accuracy", "best_accuracy",
                      "final_train_loss", "train_time_s", "train_img_s", "accuracy_by_bucket",
                      "lr", "lr_stage", "lr_source", "val_samples", "val_accuracy", "trainer",  # training columns
                      "converged", "stop_reason", "converged_samples", "target_accuracy", "samples_to_target",
                      "flops_to_target", "curve_points",  # the learning curve's and the convergence rule's
                      "tf32", "gpu_clock_mhz", "driver_version",  # CUDA-only provenance, empty on CPU by design
                      "triton_version", "mamba_ssm_version",  # empty where the package is not installed
                      "load_start", "load_end", "busy_start",  # the sweep's, added when it records the row
                      "predicted_latency_ms", "predicted_peak_mem_mb", "predicted_train_step_ms",
                      "predicted_train_peak_mem_mb", "predicted_point_s",  # the planner's, likewise
                      "paired_reference", "latency_vs_ref", "latency_vs_ref_iqr", "train_step_vs_ref",
                      "train_step_vs_ref_iqr"}  # asked for by paired_reference (tests/test_paired_timing.py)
    if row["commit"] == "unknown":  # no git repository here (a copy of the tree): its state is unknown too
        expected_empty.add("dirty")
    assert set(unfilled) <= expected_empty
    assert row["macs"] == pytest.approx(row["macs_analytic"], rel=0.01)
    assert row["flops_counted"] == pytest.approx(2 * row["macs_analytic"], rel=0.01)
    assert row["throughput_img_s"] == pytest.approx(2 / (row["latency_ms"] / 1e3))
    assert row["memory_method"] == "cpu_profiler" and row["impl"]


def test_fvcore_running_out_of_memory_keeps_the_measured_point(monkeypatch) -> None:
    """The fvcore trace is a second, float32 forward: its out-of-memory must not turn a measured point into oom."""
    import experiments.measure.run as run

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 48.00 GiB")

    monkeypatch.setattr(run, "fvcore_macs", out_of_memory)
    row = measure_point(point(mixer="attention"))
    assert row["status"] == "ok" and row["latency_ms"] > 0
    assert row.get("macs") is None and "fvcore count: out of memory" in row["error"]


def test_forced_oom_is_a_row() -> None:
    """A memory cap on the worker makes the 16K-token materialised attention fail to allocate: status oom."""
    row = run_isolated(measure_point, point(mixer="attention_naive", img_size=256, patch_size=2, batch_size=1,
                                            memory_limit_mb=400, measure_train_step=False), timeout_s=120)
    assert row["status"] == "oom", row
    assert "allocate" in row["error"]
    assert row["macs_analytic"] > 0 and row["gmacs"] > 0  # cost known even past the wall


def _killed(p: Point) -> dict:
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def _hangs(p: Point) -> dict:
    time.sleep(60)
    return {}


def _raises(p: Point) -> dict:
    raise RuntimeError("boom")


def test_isolation_turns_deaths_into_rows() -> None:
    assert run_isolated(_killed, point(), 30)["status"] == "oom"
    started = time.perf_counter()
    assert run_isolated(_hangs, point(), 1)["status"] == "timeout"
    assert time.perf_counter() - started < 30
    row = run_isolated(_raises, point(), 30)
    assert row["status"] == "error" and "boom" in row["error"]


def test_point_exits_when_the_sweep_is_killed(tmp_path) -> None:
    """A point whose sweep died (SIGKILL) must not run on: it would write checkpoints a resumed sweep also writes."""
    import subprocess
    import sys
    import textwrap

    marker = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from experiments.sweep.isolation import run_isolated
        from tests_helpers_sleeper import sleeper
        from experiments.measure.point import Point
        run_isolated(sleeper, Point(mixer="attention", preset="micro", img_size=8, patch_size=4, batch_size=1,
                                    data_path={str(marker)!r}), 600)
    """)
    helper = tmp_path / "tests_helpers_sleeper.py"
    helper.write_text("import os, time\n"
                      "def sleeper(point):\n"
                      "    open(point.data_path, 'w').write(str(os.getpid()))\n"
                      "    time.sleep(600)\n")
    sweep = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    deadline = time.time() + 60
    while not marker.exists() or not marker.read_text():
        assert time.time() < deadline, "the point never started"
        time.sleep(0.1)
    child = int(marker.read_text())
    sweep.kill()
    sweep.wait()
    deadline = time.time() + 30  # the point polls every second; a loaded 2-core machine can delay it many seconds
    while time.time() < deadline:
        state = _process_state(child)
        if state in ("", "Z"):  # gone, or exited and waiting for whoever adopted it to reap it
            return
        time.sleep(0.2)
    os.kill(child, signal.SIGKILL)
    raise AssertionError(f"the point outlived its sweep (state {state!r})")


def _process_state(pid: int) -> str:
    """The one-letter state of `pid` in /proc (R, S, Z, ...), or "" when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return ""
