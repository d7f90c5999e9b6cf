"""neighborhood's CUDA path (compiled FlexAttention) run on the CPU, where inductor compiles it: a whole
`measure_point` with the fvcore count (issue 34 item 1), and a batch-`max` style series of batches that stays under
dynamo's recompile limit without falling back to eager flex (item 2)."""
from __future__ import annotations

import json

import pytest
import torch
from torch._dynamo.utils import counters

from experiments.measure.point import Point
from experiments.measure.run import measure_point
from experiments.measure.timing import TimingProtocol
from mixers import create_mixer
from mixers.neighborhood import _flex

pytestmark = pytest.mark.skipif(_flex() is None, reason="this torch has no FlexAttention")
DIM, HEADS, GRID = 16, 2, (6, 6)


@pytest.fixture
def no_fallback():
    """Past the recompile limit dynamo would silently run flex eagerly (the dense N x N path): make it raise, and
    count the frames compiled from a fresh cache."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield
    torch._dynamo.reset()


def test_compiled_flex_point_measures_and_counts_with_fvcore(no_fallback) -> None:
    """The fvcore count traces with torch.jit.trace, inside which dynamo refuses to run; the mixer counts through
    gather there (the same function, the neighbourhood's products), so the point ends ok with `macs` filled."""
    options = {"depth": 1, "mixer_options": {"impl": "flex_compiled", "kernel_size": 3}}
    protocol = TimingProtocol(warmup=1, min_repeats=1, min_time_s=0.0, max_batch=4)
    row = measure_point(Point(mixer="neighborhood", preset="micro", img_size=24, patch_size=4, batch_size=0,
                              overrides=json.dumps(options, sort_keys=True), timing=protocol,
                              measure_train_step=False))  # FlexAttention has no CPU backward: see below
    assert row["status"] == "ok", row["error"]
    assert row["impl"] == "flex_compiled" and row["batch_used"] == 4
    assert row["macs"] > 0
    gather = measure_point(Point(mixer="neighborhood", preset="micro", img_size=24, patch_size=4, batch_size=1,
                                 overrides=json.dumps({**options, "mixer_options": {"kernel_size": 3}}),
                                 timing=protocol, measure_train_step=False))
    assert row["macs"] == gather["macs"]  # the count does not depend on the path the timing ran


def test_batch_max_series_compiles_a_few_graphs_and_never_falls_back(no_fallback) -> None:
    """Batches 1..64 without grad in two dtypes: a static graph at batch 1 and one dynamic graph per dtype, where
    static shapes compiled once per batch and passed the limit of 8 (fail_on_recompile_limit_hit raises then)."""
    torch.manual_seed(0)
    mixer = create_mixer("neighborhood", DIM, HEADS, kernel_size=3, impl="flex_compiled").eval()
    reference = create_mixer("neighborhood", DIM, HEADS, kernel_size=3, impl="gather").eval()
    reference.load_state_dict(mixer.state_dict())
    for dtype in (torch.float32, torch.bfloat16):
        mixer.to(dtype)
        for batch in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(batch, GRID[0] * GRID[1], DIM, dtype=dtype)
            with torch.inference_mode():
                out = mixer(x, GRID)
            assert mixer.impl == "flex_compiled"
        with torch.inference_mode():  # the dynamic graph computes the same function as gather
            expected = reference.to(dtype)(x, GRID)
        # bf16 keeps 8 bits of mantissa: 2^-8 relative per rounding, a few roundings deep
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(out.float(), expected.float(), rtol=tolerance, atol=tolerance)
    assert counters["frames"]["ok"] <= 4, dict(counters["frames"])


def test_compiled_flex_backward_on_the_cpu_matches_gather_or_is_refused_by_torch(no_fallback) -> None:
    """The training step's backward: FlexAttention refuses it on a CPU up to torch 2.15 (a GPU-only check, in
    tests/test_gpu_paths.py); should a release add it, the gradients must match gather's."""
    torch.manual_seed(0)
    mixer = create_mixer("neighborhood", DIM, HEADS, kernel_size=3, impl="flex_compiled")
    reference = create_mixer("neighborhood", DIM, HEADS, kernel_size=3, impl="gather")
    reference.load_state_dict(mixer.state_dict())
    x = torch.randn(2, GRID[0] * GRID[1], DIM)
    try:
        mixer(x, GRID).square().sum().backward()
    except NotImplementedError as error:
        assert "backward on CPU" in str(error)
        return
    reference(x, GRID).square().sum().backward()
    for (name, p), q in zip(mixer.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)  # fp32, different sum orders


def test_each_grid_compiles_static_graphs_that_match_gather(no_fallback) -> None:
    """Two grids in one process (a multi-resolution evaluation, or the test suite itself): each compiles its own
    two graphs (batch 1, then dynamic batch), never a graph symbolic in the token count, whose captured grid ints
    torch 2.11's flex lowering cannot take (mixers/neighborhood.py, `_compiled_flex`)."""
    torch.manual_seed(0)
    mixer = create_mixer("neighborhood", DIM, HEADS, kernel_size=3, impl="flex_compiled").eval()
    reference = create_mixer("neighborhood", DIM, HEADS, kernel_size=3, impl="gather").eval()
    reference.load_state_dict(mixer.state_dict())
    grids = ((6, 6), (5, 7))
    for grid in grids:
        for batch in (1, 2, 4):
            x = torch.randn(batch, grid[0] * grid[1], DIM)
            with torch.inference_mode():
                torch.testing.assert_close(mixer(x, grid), reference(x, grid), rtol=1e-5, atol=1e-5)
    assert counters["frames"]["ok"] == 2 * len(grids), dict(counters["frames"])
