"""The CPU custom ops' outputs carry the shapes, dtypes and strides their fakes promise.

A compiled graph (torch.compile, training included) plans its buffers from the fakes and asserts the real outputs'
strides against them: a transposed gradient where the fake says contiguous failed compiled training of every mixer
with a depthwise token conv. `torch.library.opcheck` compares values, not strides, so it did not see it.
"""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mixers  # noqa: F401 - registers the ops
from mixers.ops import gated_recurrence
from mixers.ops.norm_gate import cpp_norm_gate
from mixers.ops.selective_scan import cpp_scan
from mixers.ops.token_conv import cpp_conv


def _assert_fake_matches(op, *args) -> None:
    real = op(*args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    real, fake = ((t,) if isinstance(t, torch.Tensor) else tuple(t) for t in (real, fake))
    assert len(real) == len(fake)
    for i, (r, f) in enumerate(zip(real, fake)):
        assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), f"output {i} of {op}"


def _time_major(batch: int, length: int, channels: int) -> torch.Tensor:
    """(B, L, C) as a view of a wider projection's output, as the mixers hand it to the conv."""
    return torch.randn(batch, length, 2 * channels)[..., :channels]


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("left", [0, 3])
def test_depthwise_conv_tokens_and_its_backward(left: int, silu: bool) -> None:
    if cpp_conv.unavailable_reason() is not None:
        pytest.skip(f"the compiled conv is unavailable: {cpp_conv.unavailable_reason()}")
    x, weight, bias = _time_major(2, 9, 5), torch.randn(5, 1, 4), torch.randn(5)
    _assert_fake_matches(torch.ops.mixerbench.depthwise_conv_tokens.default, x, weight, bias, left, silu)
    grad = torch.randn(2, 9, 5)
    for b in (bias, None):
        _assert_fake_matches(torch.ops.mixerbench.depthwise_conv_tokens_backward.default, grad, x, weight, b, left,
                             silu)


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("reverse", [False, True])
def test_cpp_selective_scan_and_its_backward(groups: int, reverse: bool) -> None:
    if cpp_scan.cpp_unavailable_reason(torch.device("cpu"), torch.float32) is not None:
        pytest.skip("the C++ scan is unavailable here")
    batch, channels, length, d_state = 2, 8, 7, 3
    u, delta, z = (_time_major(batch, length, channels).transpose(1, 2) for _ in range(3))  # (B, D, L) views
    bc = torch.randn(batch, length, groups, 2 * d_state)  # B and C as views of x_proj's output, per group
    B, C = (bc[..., s : s + d_state].permute(0, 2, 3, 1) for s in (0, d_state))  # (B, G, N, L)
    if groups == 1:
        B, C = B[:, 0], C[:, 0]
    A, D, delta_bias = -torch.rand(channels, d_state), torch.randn(channels), torch.randn(channels)
    args = (u, delta, A, B, C, D, z, delta_bias, True, reverse)
    _assert_fake_matches(torch.ops.mixerbench.selective_scan_cpp.default, *args)
    dy = torch.randn(batch, length, channels).transpose(1, 2)
    _assert_fake_matches(torch.ops.mixerbench.selective_scan_cpp_bwd.default, dy, *args)
    no_options = (u, delta, A, B, C, None, None, None, False, reverse)
    _assert_fake_matches(torch.ops.mixerbench.selective_scan_cpp_bwd.default, dy, *no_options)


def test_cpp_selective_scan_with_an_order_as_vmamba_calls_it() -> None:
    """vmamba's grid form: one u for all four groups (stride 0), delta time-major per group, the orders, and the
    gradient of the groups' sum (stride 0 again)."""
    if cpp_scan.cpp_unavailable_reason(torch.device("cpu"), torch.float32) is not None:
        pytest.skip("the C++ scan is unavailable here")
    from mixers.vmamba import scan_orders

    batch, groups, width, d_state, grid = 2, 4, 5, 1, (3, 4)
    length = grid[0] * grid[1]
    u = torch.randn(batch, length, width).transpose(1, 2).unsqueeze(1).expand(batch, groups, width, length)
    delta = torch.randn(groups, batch, length, width).permute(1, 0, 3, 2)
    bc = torch.randn(batch, length, groups, 2 * d_state)
    B, C = (bc[..., s : s + d_state].permute(0, 2, 3, 1) for s in (0, d_state))
    A, D, delta_bias = -torch.rand(groups * width, d_state), torch.randn(groups * width), torch.randn(groups * width)
    args = (u, delta, A, B, C, D, None, delta_bias, True, False, scan_orders(grid, torch.device("cpu")))
    _assert_fake_matches(torch.ops.mixerbench.selective_scan_cpp.default, *args)
    dy = torch.randn(batch, length, width).transpose(1, 2).unsqueeze(1).expand(batch, groups, width, length)
    _assert_fake_matches(torch.ops.mixerbench.selective_scan_cpp_bwd.default, dy, *args)


def test_gated_recurrence_ops_and_their_backwards() -> None:
    if gated_recurrence.unavailable_reason(torch.device("cpu")) is not None:
        pytest.skip("the compiled gated recurrence is unavailable here")
    batch, heads, length, keys, values = 2, 3, 7, 4, 5
    # (D, B, H, L, *) as the mixers pass them: q, k, v read by both directions (stride 0), views of (B, L, H, *)
    q, k = (torch.randn(batch, length, heads, keys).transpose(1, 2).expand(2, -1, -1, -1, -1) for _ in range(2))
    v = torch.randn(batch, length, heads, values).transpose(1, 2).expand(2, -1, -1, -1, -1)
    g = torch.randn(2, batch, length, heads, keys).transpose(2, 3)
    _assert_fake_matches(torch.ops.mixerbench.gla_recurrent_cpp.default, q, k, v, g, 0.5, 16)
    do = torch.randn(2, batch, heads, length, values)
    _assert_fake_matches(torch.ops.mixerbench.gla_recurrent_cpp_bwd.default, do, q, k, v, g, 0.5)
    x, a = torch.randn(2, batch, length, heads, values), -torch.rand(2, batch, length, heads)
    b, c = torch.randn(batch, length, 2, 2 * keys).movedim(2, 0).split(keys, dim=-1)  # views of one projection
    _assert_fake_matches(torch.ops.mixerbench.ssd_recurrent_cpp.default, x, a, b, c, 32)
    _assert_fake_matches(torch.ops.mixerbench.ssd_recurrent_cpp_bwd.default, torch.randn_like(x), x, a, b, c)
    u, dt = x[0], a.exp()  # u read by both directions, each with its own step sizes
    _assert_fake_matches(torch.ops.mixerbench.ssd_hydra_cpp.default, u, dt, a, b, c, 32)
    _assert_fake_matches(torch.ops.mixerbench.ssd_hydra_cpp_bwd.default, torch.randn_like(u), u, dt, a, b, c)


def test_gated_rms_norm_op_and_its_backward() -> None:
    if cpp_norm_gate.unavailable_reason() is not None:
        pytest.skip("the compiled gated RMSNorm is unavailable here")
    x, z = (torch.randn(10, 24)[:, :12] for _ in range(2))  # rows of wider projections
    weight = torch.randn(4)
    _assert_fake_matches(torch.ops.mixerbench.rms_norm_gated.default, x, weight, z, 1e-5)
    _assert_fake_matches(torch.ops.mixerbench.rms_norm_gated_backward.default, torch.randn(10, 12), x, weight, z, 1e-5)
