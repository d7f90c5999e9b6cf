"""The CUDA-only paths of issue 34 on a real GPU, one test (or more) per row of results/README.md's table "CUDA-only
paths": what the CPU tests cannot show (real kernels, the allocator, graphs). Skipped without a CUDA device; run
first on a GPU by `python -m experiments.gpu_smoke` (which adds one point per mixer and a device-trainer run)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from experiments.measure import graphed
from experiments.measure.oom import is_out_of_memory
from experiments.measure.point import Point
from experiments.measure.run import measure_point
from experiments.measure.timing import TimingProtocol, time_call
from mixers import create_mixer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")
QUICK = TimingProtocol(warmup=1, min_repeats=2, min_time_s=0.0, max_batch=64)
SMALL = dict(preset="micro", img_size=32, patch_size=4, device="cuda", timing=QUICK)
DIM, HEADS, GRID = 64, 2, (12, 10)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# --- neighborhood: compiled FlexAttention ---------------------------------------------------------------------

def _neighborhood_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    flex = create_mixer("neighborhood", DIM, HEADS, kernel_size=5).cuda()
    gather = create_mixer("neighborhood", DIM, HEADS, kernel_size=5, impl="gather").cuda()
    gather.load_state_dict(flex.state_dict())
    with torch.no_grad():
        flex.rpb.normal_()  # a bias far from zero, so a wrong offset shows
        gather.rpb.copy_(flex.rpb)
    return flex, gather


def test_neighborhood_flex_matches_gather_forward_and_backward() -> None:
    flex, gather = _neighborhood_pair()
    x = torch.randn(2, GRID[0] * GRID[1], DIM, device=CUDA)
    out = flex(x, GRID)
    assert flex.impl == "flex"
    expected = gather(x, GRID)
    # fp32 both; a wrong offset or mask moves the result by O(1), any TF32 rounding by ~1e-4
    assert relative_error(out, expected) < 1e-3
    out.square().sum().backward()
    expected.square().sum().backward()
    for (name, p), q in zip(flex.named_parameters(), gather.parameters()):
        assert relative_error(p.grad, q.grad) < 1e-2, name  # as above, and the backward's atomics reorder sums


def test_neighborhood_batch_max_series_stays_compiled() -> None:
    """A bf16 point's two searches, batches 1..256: inference (bf16 weights, no grad) and the training step
    (autocast, grad), within dynamo's recompile limit (8) and never on eager flex."""
    flex, _ = _neighborhood_pair()
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for training in (False, True):
            flex.to(torch.float32 if training else torch.bfloat16)
            for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256):
                x = torch.randn(batch, GRID[0] * GRID[1], DIM, device=CUDA,
                                dtype=torch.float32 if training else torch.bfloat16)
                with torch.set_grad_enabled(training), torch.autocast("cuda", torch.bfloat16, enabled=training):
                    out = flex(x, GRID)
                if training:
                    out.float().sum().backward()
                assert flex.impl == "flex"
    # batch 1 specialised and one dynamic graph per search: 4; 6 leaves room for a guard on autocast's state
    assert counters["frames"]["ok"] <= 6, dict(counters["frames"])


def test_neighborhood_point_trains_and_counts_with_fvcore() -> None:
    row = measure_point(Point(mixer="neighborhood", batch_size=0, dtype="bfloat16", **SMALL))
    assert row["status"] == "ok", row["error"]
    assert row["impl"] == "flex" and row["macs"] > 0 and row["train_status"] == "ok"


# --- graphed timing and the measured peak ---------------------------------------------------------------------

def test_graphed_training_replays_rewrite_gradients() -> None:
    """Captured with grads set to None (the recipe), each replay writes the same gradient; never their sum."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    x, y = torch.randn(16, 32, device=CUDA), torch.randint(0, 8, (16,), device=CUDA)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, capturable=True)  # lr 0: the weights stay put

    def forward_backward() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        forward_backward()

    replay = graphed.capture(forward_backward, CUDA, warmup=step,
                             before_capture=lambda: optimizer.zero_grad(set_to_none=True))
    replay()
    first = [p.grad.clone() for p in model.parameters()]
    replay()
    replay()
    for a, b in zip(first, (p.grad for p in model.parameters())):
        torch.testing.assert_close(b, a)  # the same kernels on the same inputs


@pytest.mark.parametrize("mixer", ["attention", "linear"])
def test_graphed_peak_memory_matches_eager(mixer: str) -> None:
    """Both regimes read memory from the same eager call; graphed warms it up first, so what the first call on
    the stream allocates (cuBLAS's workspace) is below the baseline in both."""
    rows = {mode: measure_point(Point(mixer=mixer, batch_size=4, timing_mode=mode, dtype="bfloat16", **SMALL))
            for mode in ("eager", "graphed")}
    for row in rows.values():
        assert row["status"] == "ok", row["error"]
    assert abs(rows["graphed"]["peak_mem_mb"] - rows["eager"]["peak_mem_mb"]) < 1.0  # MiB; 32 for the workspace
    assert abs(rows["graphed"]["train_peak_mem_mb"] - rows["eager"]["train_peak_mem_mb"]) < 1.0


def test_event_clock_times_back_to_back() -> None:
    x = torch.randn(256, 256, device=CUDA)
    timing = time_call(lambda: x @ x, CUDA, TimingProtocol(warmup=2, min_repeats=3, min_time_s=0.0))
    assert timing.calls_per_sample > 1 and timing.median_ms > 0


# --- batch max and out-of-memory ------------------------------------------------------------------------------

def test_real_cuda_out_of_memory_reads_as_one() -> None:
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(torch.cuda.OutOfMemoryError) as error:
        torch.empty(4 * free, dtype=torch.uint8, device=CUDA)
    assert is_out_of_memory(error.value)


def test_batch_max_on_cuda_records_its_batch() -> None:
    row = measure_point(Point(mixer="attention", batch_size=0, dtype="bfloat16", **SMALL))
    assert row["status"] == "ok", row["error"]
    assert row["batch_used"] == 64 and row["train_batch_used"] == 64  # a micro model at 64 tokens fits


# --- newer mixers on CUDA in bf16 ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["neighborhood", "vmamba", "gla", "mamba2"])
def test_newer_mixers_cuda_bf16_match_cpu_fp32(name: str) -> None:
    torch.manual_seed(0)
    cpu = create_mixer(name, 96, 3, layer_idx=1)
    gpu = create_mixer(name, 96, 3, layer_idx=1)
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 15 * 17, 96)
    reference = cpu(x, (15, 17))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = gpu.cuda()(x.cuda(), (15, 17))
    assert relative_error(out.float().cpu(), reference) < 3e-2  # bf16 keeps 8 bits: 2^-8 a rounding, a few deep


def test_gla_fla_kernels_match_the_pytorch_form() -> None:
    pytest.importorskip("fla", reason="flash-linear-attention is not installed (pip install -e '.[fla]')")
    torch.manual_seed(0)
    fast = create_mixer("gla", 96, 3).cuda()
    reference = create_mixer("gla", 96, 3, impl="chunk_torch").cuda()
    reference.load_state_dict(fast.state_dict())
    x = torch.randn(2, 15 * 17, 96, device=CUDA, requires_grad=True)
    out, expected = fast(x, (15, 17)), reference(x, (15, 17))
    assert fast.impl == "fla_chunk"
    assert relative_error(out, expected) < 1e-3  # fp32 in both; fla's kernels use TF32 dot products
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    (grad_ref,) = torch.autograd.grad(expected.square().sum(), x)
    assert relative_error(grad, grad_ref) < 1e-2


# --- the device trainer ----------------------------------------------------------------------------------------

def test_device_trainer_on_cuda_steps_fused_adamw_and_checkpoints_the_cuda_rng(tmp_path: Path) -> None:
    from experiments.train.recipe import CHECKPOINT_NAME

    train = json.dumps({"train_samples": 256, "batch_size": 64, "warmup_epochs": 0.0})
    row = measure_point(Point(mixer="attention", batch_size=1, dataset="reach", epochs=1, train=train,
                              dtype="bfloat16", checkpoint_dir=str(tmp_path), measure_train_step=False, **SMALL))
    assert row["status"] == "ok", row["error"]
    saved = torch.load(tmp_path / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    assert saved["rng_cuda"].dtype == torch.uint8 and saved["rng_cuda"].numel() > 0
    assert saved["optimizer"]["param_groups"][0]["fused"] is True


# --- bench.scan on CUDA ---------------------------------------------------------------------------------------

def test_bench_scan_cuda_runs_its_shortest_length() -> None:
    from experiments.bench.scan import bench_cuda

    rows = bench_cuda((1024,), channels=64, repeats=1, block_seconds=0.01, stream_max_length=1024)
    assert rows and all(ms > 0 for _, _, _, ms, _ in rows)
