"""Vision Mamba mixer: Vim's bidirectional semantics, Mamba's initialisation, and its MACs against the counters."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from margins import clearly_non_zero, largest
from mixers import create_mixer
from mixers.mamba import VimMixer
from mixers.ops.selective_scan import selective_scan_reference

DIM = 32


def build(**options) -> VimMixer:
    mixer = create_mixer("mamba", DIM, 2, **options)
    assert isinstance(mixer, VimMixer)
    return mixer


def vim_reference(mixer: VimMixer, x: torch.Tensor) -> torch.Tensor:
    """The bimamba-v2 block written out in float64 with the reference scan, following Vim's mamba_simple.py."""
    m = mixer.double()
    x = x.double()
    L = x.shape[1]
    xz = (x @ m.in_proj.weight.T).transpose(1, 2)  # (B, 2 d_inner, L)
    x_in, z = xz[:, : m.d_inner], xz[:, m.d_inner :]

    def direction(x_in, z, conv, x_proj, dt_proj, A_log, D):
        h = F.silu(F.conv1d(F.pad(x_in, (m.d_conv - 1, 0)), conv.weight, conv.bias, groups=m.d_inner))
        x_dbl = h.transpose(1, 2) @ x_proj.weight.T  # (B, L, dt_rank + 2N)
        dt = x_dbl[..., : m.dt_rank] @ dt_proj.weight.T  # (B, L, d_inner)
        B = x_dbl[..., m.dt_rank : m.dt_rank + m.d_state].transpose(1, 2)
        C = x_dbl[..., m.dt_rank + m.d_state :].transpose(1, 2)
        return selective_scan_reference(h, dt.transpose(1, 2), -A_log.exp(), B, C, D, z, dt_proj.bias, True)

    y_f = direction(x_in, z, m.conv1d, m.x_proj, m.dt_proj, m.A_log, m.D)
    y_b = direction(x_in.flip(-1), z.flip(-1), m.conv1d_b, m.x_proj_b, m.dt_proj_b, m.A_b_log, m.D_b)
    y = (y_f + y_b.flip(-1)) / 2
    assert y.shape[-1] == L
    return y.transpose(1, 2) @ m.out_proj.weight.T


@pytest.mark.parametrize("scan_impl", ["auto", "cpp_loop", "torch_stream", "torch_loop"])
@pytest.mark.parametrize("grid", [(1, 1), (3, 5), (9, 11)])
def test_matches_vim_reference(scan_impl: str, grid: tuple[int, int]) -> None:
    from mixers.ops.selective_scan import resolve_scan_impl
    from mixers.ops.selective_scan.cpp_scan import cpp_unavailable_reason

    if scan_impl == "cpp_loop" and (why := cpp_unavailable_reason(torch.device("cpu"), torch.float32)):
        pytest.skip(why)
    mixer = build(scan_impl=scan_impl).eval()
    with torch.no_grad():  # random weights give a non-trivial D, conv and dt to check
        for p in mixer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, grid[0] * grid[1], DIM)
    with torch.no_grad():
        out = mixer(x, grid)
    assert mixer.impl == resolve_scan_impl(scan_impl, torch.device("cpu"))
    ref = vim_reference(mixer, x)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_shape_and_dtype_kept(dtype: torch.dtype) -> None:
    mixer = build().to(dtype)
    x = torch.randn(2, 6 * 7, DIM, dtype=dtype)
    out = mixer(x, (6, 7))
    assert out.shape == x.shape and out.dtype == dtype and torch.isfinite(out).all()


def test_rejects_wrong_grid() -> None:
    with pytest.raises(ValueError, match="grid"):
        build()(torch.randn(1, 10, DIM), (3, 4))


def test_gradient_reaches_every_parameter() -> None:
    mixer = build().double().train()
    x = torch.randn(2, 5 * 7, DIM, dtype=torch.float64, requires_grad=True)
    mixer(x, (5, 7)).square().sum().backward()
    grads = {"input": x.grad, **{name: p.grad for name, p in mixer.named_parameters()}}
    assert all(g is not None for g in grads.values()), [k for k, g in grads.items() if g is None]
    scale = largest(list(grads.values()))
    assert not [k for k, g in grads.items() if not clearly_non_zero(g, scale)], "no gradient reaches them"


def test_bidirectional() -> None:
    """The first token's output depends on the last token's input and vice versa: both scan directions run."""
    mixer = build().double()
    x = torch.randn(1, 4 * 6, DIM, dtype=torch.float64, requires_grad=True)
    out = mixer(x, (4, 6))
    (d_first_d_x,) = torch.autograd.grad(out[0, 0].sum(), x, retain_graph=True)
    (d_last_d_x,) = torch.autograd.grad(out[0, -1].sum(), x)
    assert clearly_non_zero(d_first_d_x[0, -1], largest([d_first_d_x]))
    assert clearly_non_zero(d_last_d_x[0, 0], largest([d_last_d_x]))


def test_initialisation_follows_mamba() -> None:
    dt_min, dt_max = 0.001, 0.1
    mixer = build(d_state=8, dt_min=dt_min, dt_max=dt_max)
    assert mixer.d_inner == 2 * DIM and mixer.dt_rank == math.ceil(DIM / 16)
    expected_A_log = torch.log(torch.arange(1, 9, dtype=torch.float32)).expand(mixer.d_inner, 8)
    for A_log, D, dt_proj in ((mixer.A_log, mixer.D, mixer.dt_proj), (mixer.A_b_log, mixer.D_b, mixer.dt_proj_b)):
        torch.testing.assert_close(A_log.data, expected_A_log)
        assert torch.equal(D.data, torch.ones(mixer.d_inner))
        assert A_log._no_weight_decay and D._no_weight_decay and dt_proj.bias._no_reinit
        dt = F.softplus(dt_proj.bias)
        assert dt.min() >= dt_min * (1 - 1e-4) and dt.max() <= dt_max * (1 + 1e-4)
        assert dt_proj.weight.abs().max() <= mixer.dt_rank**-0.5
    assert not torch.equal(mixer.dt_proj.bias, mixer.dt_proj_b.bias), "each direction draws its own dt"
    floored = build(dt_min=1e-6, dt_max=1e-5, dt_init_floor=1e-4)
    torch.testing.assert_close(F.softplus(floored.dt_proj.bias), torch.full((floored.d_inner,), 1e-4))


def test_vim_parameter_names() -> None:
    names = {name for name, _ in build().named_parameters()}
    for stem in ("conv1d", "x_proj", "dt_proj"):
        assert any(n.startswith(f"{stem}.") for n in names) and any(n.startswith(f"{stem}_b.") for n in names)
    assert {"A_log", "A_b_log", "D", "D_b", "in_proj.weight", "out_proj.weight"} <= names


@pytest.mark.parametrize("grid", [(5, 13), (14, 14)])
@pytest.mark.parametrize("options", [{}, {"d_state": 8, "d_conv": 3, "expand": 1, "dt_rank": 5, "bias": True}])
def test_macs_match_flop_counter(grid: tuple[int, int], options: dict) -> None:
    """FlopCounterMode counts the scan op by its formula, conv1d over its L + d_conv - 1 outputs, linears as mm."""
    mixer = build(**options)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        mixer(torch.randn(1, grid[0] * grid[1], DIM), grid)
    assert mixer.macs(grid) == counter.get_total_flops() // 2
    counted_ops = {str(op) for op in counter.get_flop_counts()["Global"]}
    assert f"mixerbench.{'selective_scan_cpp' if mixer.impl == 'cpp_loop' else 'selective_scan'}" in counted_ops


def test_macs_match_fvcore() -> None:
    """fvcore's jit trace sees the scan as `mixerbench::selective_scan` and counts it with the registered handle."""
    from experiments.measure.counting import fvcore_macs

    grid = (5, 7)

    class Wrapped(nn.Module):
        def __init__(self, mixer: nn.Module) -> None:
            super().__init__()
            self.mixer = mixer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mixer(x, grid)

    mixer = build().eval()
    assert fvcore_macs(Wrapped(mixer), torch.randn(1, 35, DIM)) == mixer.macs(grid)


def test_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="scan_impl"):
        build(scan_impl="nope")
    with pytest.raises(ValueError, match="dt_rank"):
        build(dt_rank=0)


@pytest.mark.parametrize("scan_impl", ["triton", "mamba_ssm_cuda", "auto"])
def test_meta_device_counts_like_torch_stream(scan_impl: str) -> None:
    """Counting builds models on the meta device: every scan_impl counts there (no CUDA, no triton needed), and
    FlopCounterMode gives the same FLOPs as scan_impl='torch_stream'."""
    grid = (5, 13)
    flops = {}
    for impl in (scan_impl, "torch_stream"):
        with torch.device("meta"):
            mixer = build(scan_impl=impl)
            x = torch.empty(2, grid[0] * grid[1], DIM)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            out = mixer(x, grid)
        assert out.device.type == "meta" and out.shape == x.shape
        flops[impl] = counter.get_total_flops()
        ops = {str(op) for op in counter.get_flop_counts()["Global"]}
        assert ("mixerbench.selective_scan_triton" if impl == "triton" else "mixerbench.selective_scan") in ops
    assert flops[scan_impl] == flops["torch_stream"] == 2 * build().macs(grid) * 2


def test_training_step_counts_the_same_on_meta_as_on_cpu() -> None:
    """A training step's FLOPs (forward and the scan's hand-written backward) counted on the meta device, where
    the backward takes a shapes-only path, equal the count of the real backward on CPU tensors."""
    grid = (3, 5)
    flops = {}
    for device in ("meta", "cpu"):
        torch.manual_seed(0)
        with torch.device(device):
            mixer = build(scan_impl="torch_stream")
            x = torch.randn(2, grid[0] * grid[1], DIM, requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            mixer(x, grid).square().sum().backward()
        flops[device] = counter.get_total_flops()
    assert flops["meta"] == flops["cpu"] > 2 * build().macs(grid) * 2
