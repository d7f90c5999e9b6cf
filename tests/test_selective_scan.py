"""Parity of the pure-PyTorch selective scans with the float64 reference, and the custom op's registrations."""
from __future__ import annotations

import functools
import itertools
import re
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from cross_scan_orders import cross_scan_orders
from mixers.base import CUSTOM_OP_MACS
import mixers.ops.selective_scan as scan_module
from mixers.ops.selective_scan import cpp_scan
from mixers.ops.selective_scan.cpp_scan import cpp_unavailable_reason, selective_scan_cpp_call
from mixers.ops.selective_scan import (
    SCAN_IMPLS,
    resolve_scan_impl,
    selective_scan,
    selective_scan_flops,
    selective_scan_loop,
    selective_scan_reference,
    selective_scan_stream,
)

LENGTHS = [1, 7, 64, 100, 257]
OPTIONS = list(itertools.product([False, True], repeat=4))  # (D, z, delta_bias, delta_softplus)
CPP_PROBLEM = cpp_unavailable_reason(torch.device("cpu"), torch.float32)
needs_cpp = pytest.mark.skipif(CPP_PROBLEM is not None, reason=f"cpp_loop: {CPP_PROBLEM}")
FAST_IMPLS = [pytest.param("cpp_loop", marks=needs_cpp), "torch_stream", "torch_loop"]


def make_inputs(
    batch: int = 2,
    channels: int = 6,
    length: int = 33,
    d_state: int = 5,
    *,
    with_D: bool = True,
    with_z: bool = True,
    with_bias: bool = True,
    softplus: bool = True,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> dict:
    """Inputs in the ranges Mamba sees: A < 0, delta > 0 after the optional bias and softplus."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    delta = randn(batch, channels, length) if softplus else torch.rand(batch, channels, length, generator=g) * 0.5
    return dict(
        u=randn(batch, channels, length),
        delta=delta.to(dtype),
        A=-(torch.rand(channels, d_state, generator=g) * 2 + 0.1).to(dtype),
        B=randn(batch, d_state, length),
        C=randn(batch, d_state, length),
        D=randn(channels) if with_D else None,
        z=randn(batch, channels, length) if with_z else None,
        # Without softplus a negative bias could make delta < 0 and the decay exp(delta A) > 1.
        delta_bias=((randn(channels) if softplus else randn(channels).abs()) * 0.5 if with_bias else None),
        delta_softplus=softplus,
    )


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| / max |ref|: a relative error that does not blow up at entries near zero."""
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def run(impl: str, inputs: dict) -> torch.Tensor:
    y, name = selective_scan(**inputs, impl=impl)
    assert name == impl
    return y


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_D,with_z,with_bias,softplus", OPTIONS)
@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_float32_matches_reference(impl: str, length: int, with_D: bool, with_z: bool, with_bias: bool, softplus: bool):
    inputs = make_inputs(length=length, with_D=with_D, with_z=with_z, with_bias=with_bias, softplus=softplus)
    y = run(impl, inputs)
    assert y.dtype == torch.float32 and y.shape == inputs["u"].shape
    assert rel_err(y, selective_scan_reference(**inputs)) <= 1e-5


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_float64_matches_reference(impl: str, length: int) -> None:
    inputs = make_inputs(length=length, dtype=torch.float64)
    y = run(impl, inputs)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, selective_scan_reference(**inputs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("length", [1, 7, 100])
@pytest.mark.parametrize("with_D,with_z,with_bias,softplus", [(True, True, True, True), (False, False, False, False)])
@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_gradients_match_reference(impl: str, length: int, with_D: bool, with_z: bool, with_bias: bool, softplus: bool):
    inputs = make_inputs(
        length=length, with_D=with_D, with_z=with_z, with_bias=with_bias, softplus=softplus, dtype=torch.float64
    )
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    leaves = {k: inputs[k].clone().requires_grad_() for k in names}
    dy = torch.randn_like(inputs["u"])
    y_ref = selective_scan_reference(**{**inputs, **leaves})
    grads_ref = torch.autograd.grad(y_ref, list(leaves.values()), dy)
    y = run(impl, {**inputs, **leaves})
    grads = torch.autograd.grad(y, list(leaves.values()), dy)
    for name, g, g_ref in zip(names, grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10, msg=f"d/d{name} differs")


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_reverse_scans_backwards_in_time(impl: str) -> None:
    """`reverse=True` (native in `cpp_loop`, flipped around the pure-PyTorch impls) equals the reference's loop run from the last step
    to the first, forward and every gradient; and that loop equals flip, scan, flip back (Vim's formulation)."""
    inputs = make_inputs(length=19, dtype=torch.float64)
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    leaves = {k: inputs[k].clone().requires_grad_() for k in names}
    dy = torch.randn_like(inputs["u"])
    y_ref = selective_scan_reference(**{**inputs, **leaves}, reverse=True)
    grads_ref = torch.autograd.grad(y_ref, list(leaves.values()), dy)
    y, name = selective_scan(**{**inputs, **leaves}, impl=impl, reverse=True)
    assert name == impl
    grads = torch.autograd.grad(y, list(leaves.values()), dy)
    for key, g, g_ref in zip(["y", *names], (y, *grads), (y_ref, *grads_ref)):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10, msg=f"{key} differs")
    flipped = {k: v.flip(-1) if k in ("u", "delta", "B", "C", "z") else v for k, v in inputs.items()}
    torch.testing.assert_close(selective_scan_reference(**flipped).flip(-1), y_ref.detach(), rtol=1e-12, atol=1e-12)


def test_backward_chunking_is_exact() -> None:
    """The op's backward recomputes states chunk by chunk; chunk edges must not change the gradients."""
    from mixers.ops.selective_scan.stream import _stream_backward

    inputs = make_inputs(length=23, dtype=torch.float64)
    dy = torch.randn_like(inputs["u"])
    args = [inputs[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus")]
    whole = _stream_backward(dy, *args, chunk_size=23)
    for chunk in (1, 4, 22):
        for g, g_whole in zip(_stream_backward(dy, *args, chunk_size=chunk), whole):
            torch.testing.assert_close(g, g_whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 1, 5, 64, 1000])
def test_streaming_inference_equals_training_path(chunk_size: int | None) -> None:
    inputs = make_inputs(length=257)
    with torch.no_grad():
        y_stream = selective_scan_stream(**inputs, chunk_size=chunk_size)
    y_train = selective_scan_loop(**{k: v.requires_grad_() if k == "u" else v for k, v in inputs.items()})
    torch.testing.assert_close(y_stream, y_train.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_half_precision_accumulates_in_float32(impl: str, dtype: torch.dtype) -> None:
    """Half-precision inputs give half-precision outputs and grads, as close as rounding the inputs allows."""
    inputs = make_inputs(length=100, dtype=dtype)
    leaves = {k: v.requires_grad_() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    y = run(impl, {**inputs, **leaves})
    assert y.dtype == dtype
    assert rel_err(y, selective_scan_reference(**inputs)) < 1e-2
    y.float().square().sum().backward()
    # The float64 reference on the same (rounded) inputs, with the same upstream gradient d(sum y^2)/dy = 2y.
    exact = {k: inputs[k].double().requires_grad_() for k in leaves}
    y_exact = selective_scan_reference(**{**inputs, **exact})
    grads_exact = torch.autograd.grad(y_exact, list(exact.values()), 2 * y.detach().double())
    for (name, leaf), g_exact in zip(leaves.items(), grads_exact):
        assert leaf.grad is not None and leaf.grad.dtype == dtype, name
        assert rel_err(leaf.grad, g_exact) < 2e-2, name  # bf16 output rounding alone is ~4e-3


def test_opcheck() -> None:
    inputs = make_inputs(length=7, d_state=3)
    args = tuple(inputs.values())
    grad_args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)
    no_optional = (*args[:5], None, None, None, False)
    for sample in (args, grad_args, no_optional):
        torch.library.opcheck(torch.ops.mixerbench.selective_scan.default, sample)


@pytest.mark.parametrize("batch,channels,length,d_state", [(1, 192, 1024, 16), (3, 10, 7, 4)])
def test_flop_counter_counts_the_op_by_formula(batch: int, channels: int, length: int, d_state: int) -> None:
    flops = selective_scan_flops(batch, channels, length, d_state)
    assert flops == 9 * batch * channels * length * d_state
    inputs = make_inputs(batch, channels, length, d_state)
    with torch.device("meta"), FlopCounterMode(display=False) as counter:
        meta_inputs = (v.to("meta") if isinstance(v, torch.Tensor) else v for v in inputs.values())
        torch.ops.mixerbench.selective_scan(*meta_inputs)
    assert counter.get_total_flops() == flops
    shapes = [tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in inputs.values()]
    assert CUSTOM_OP_MACS["mixerbench::selective_scan"](shapes) * 2 == flops


def test_flop_counter_counts_one_op_not_the_loop() -> None:
    """With grad enabled the forward is still one op counted by its formula, and the backward runs."""
    inputs = make_inputs(length=9)
    u = inputs["u"].requires_grad_()
    with FlopCounterMode(display=False) as counter:
        y, name = selective_scan(**inputs)
    op = torch.ops.mixerbench.selective_scan_cpp if name == "cpp_loop" else torch.ops.mixerbench.selective_scan
    expected = {op: selective_scan_flops(2, 6, 9, 5)}
    assert counter.get_flop_counts()["Global"] == expected
    y.sum().backward()
    assert u.grad is not None


def test_impl_resolution_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert resolve_scan_impl("auto", cpu) == ("torch_stream" if CPP_PROBLEM else "cpp_loop")
    assert resolve_scan_impl("torch_loop", cpu) == "torch_loop"
    with pytest.raises(RuntimeError, match="mamba_ssm_cuda"):
        resolve_scan_impl("mamba_ssm_cuda", cpu)
    with pytest.raises(ValueError, match="unknown scan impl"):
        resolve_scan_impl("cuda_magic", cpu)
    meta = torch.device("meta")  # shapes only: routed to ops with fakes and the flop formula
    assert [resolve_scan_impl(i, meta) for i in SCAN_IMPLS] == [
        "torch_stream", "torch_stream", "triton", "torch_stream", "torch_stream", "torch_loop"]
    _, name = selective_scan(**make_inputs(length=3))
    assert name == resolve_scan_impl("auto", cpu)


# The compiled CPU loop (`cpp_loop`): channel blocks of 16 and backward chunks of 64 steps, so the shapes below
# cross both edges (19 and 40 channels, lengths around 64 and 128), at the state sizes the mixers use (vmamba 1,
# mamba 16) and odd ones, with one and two threads (the backward's per-thread partial sums).
CPP_SHAPES = [(2, 19, 1, 1), (1, 40, 63, 1), (2, 19, 65, 16), (1, 17, 130, 5), (3, 3, 7, 17)]


@needs_cpp
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch,channels,length,d_state", CPP_SHAPES)
def test_cpp_loop_float64_forward_and_gradients(batch: int, channels: int, length: int, d_state: int, reverse: bool,
                                                threads: int) -> None:
    """float64 runs the same loop in double with std::exp: equal to the reference to round-off (1e-10)."""
    inputs = make_inputs(batch, channels, length, d_state, dtype=torch.float64)
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    leaves = {k: inputs[k].clone().requires_grad_() for k in names}
    dy = torch.randn_like(inputs["u"])
    y_ref = selective_scan_reference(**{**inputs, **leaves}, reverse=reverse)
    grads_ref = torch.autograd.grad(y_ref, list(leaves.values()), dy)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y, name = selective_scan(**{**inputs, **leaves}, impl="cpp_loop", reverse=reverse)
        grads = torch.autograd.grad(y, list(leaves.values()), dy)
    finally:
        torch.set_num_threads(before)
    assert name == "cpp_loop"
    for key, g, g_ref in zip(["y", *names], (y, *grads), (y_ref, *grads_ref)):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10, msg=f"{key} differs")


@needs_cpp
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("d_state", [1, 12, 16])
def test_cpp_loop_float32_gradients_near_float64(d_state: int, reverse: bool) -> None:
    """In float32 the decay comes from a polynomial exp (about 2 ulp): every gradient within 1e-4 of the float64
    reference's largest entry (float32 accumulation over 300 steps alone gives ~1e-5). dB and dC are summed per
    state in place at N = 1, through 16-row networks at N = 16 (AVX-512 builds), both ways at N = 12."""
    inputs = make_inputs(2, 20, 300, d_state)
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    leaves = {k: inputs[k].clone().requires_grad_() for k in names}
    exact = {k: inputs[k].double().requires_grad_() for k in names}
    dy = torch.randn_like(inputs["u"])
    y, _ = selective_scan(**{**inputs, **leaves}, impl="cpp_loop", reverse=reverse)
    grads = torch.autograd.grad(y, list(leaves.values()), dy)
    y_ref = selective_scan_reference(**{**inputs, **exact}, reverse=reverse)
    grads_ref = torch.autograd.grad(y_ref, list(exact.values()), dy.double())
    assert rel_err(y, y_ref) <= 1e-5
    for name, g, g_ref in zip(names, grads, grads_ref):
        assert g.dtype == torch.float32
        assert rel_err(g, g_ref) <= 1e-4, name


@needs_cpp
def test_cpp_loop_decays_underflow_to_zero() -> None:
    """Steps so long that exp(delta A) is below float32's range (exponents to -1e4) give finite outputs equal to the
    reference (whose float64 decays are 0 or denormal there too): the polynomial exp flushes, never overflows."""
    inputs = make_inputs(1, 4, 9, 3, softplus=False, with_bias=False)
    inputs["delta"] = inputs["delta"] * 4000
    y, _ = selective_scan(**inputs, impl="cpp_loop")
    assert torch.isfinite(y).all()
    assert rel_err(y, selective_scan_reference(**inputs)) <= 1e-5


@needs_cpp
def test_cpp_loop_decays_are_exp_over_floats_range() -> None:
    """The kernel's decay exp(delta A), element by element, against float64's exp from 0 to -100 (past its underflow
    at -87.3, where it flushes to 0), and NaN carried through: two steps per channel, the first setting h = 1
    (delta = u = B = 1, C = 0), the second reading y = exp(-delta) h (B = 0, C = 1, A = -1)."""
    count = 2001
    x = torch.linspace(0, 100, count)
    x[7] = float("nan")
    delta = torch.stack([torch.ones(count), x], dim=-1).unsqueeze(0)  # (B, D, L): a channel per value
    inputs = dict(u=torch.ones(1, count, 2), delta=delta, A=-torch.ones(count, 1), B=torch.tensor([[[1.0, 0.0]]]),
                  C=torch.tensor([[[0.0, 1.0]]]))
    y, _ = selective_scan(**inputs, impl="cpp_loop")
    decay = y[0, :, 1].double()
    assert decay[7].isnan()
    keep = ~x.isnan()
    expected = torch.exp(-x[keep].double())
    expected[x[keep] > 87.3] = 0
    torch.testing.assert_close(decay[keep], expected, rtol=1e-6, atol=torch.finfo(torch.float32).tiny)


@needs_cpp
def test_cpp_loop_fused_softplus_and_gate_match_torch_over_their_range() -> None:
    """The forward kernel's own softplus (after the bias) and silu gate agree, element by element, with torch's on
    every range a model can hand them: delta + bias from -90 to 90 (past the threshold at 20 and past exp's
    underflow at -87, where both give 0 or a subnormal), z from -200 to 200. One step per channel from h = 0 with
    u = B = C = 1 makes y = softplus(delta + bias); B = C = 0 with D = 1 makes y = u silu(z)."""
    count = 2001
    pre = torch.linspace(-90, 90, count).reshape(1, count, 1)  # (B, D, L): a channel per value, one step each
    softplus_inputs = dict(
        u=torch.ones(1, count, 1), delta=pre - 0.25, A=-torch.ones(count, 1), B=torch.ones(1, 1, 1),
        C=torch.ones(1, 1, 1), delta_bias=torch.full((count,), 0.25), delta_softplus=True,
    )
    y, _ = selective_scan(**softplus_inputs, impl="cpp_loop")
    tiny = torch.finfo(torch.float32).tiny
    summed = (softplus_inputs["delta"] + 0.25).double()  # the float32 sum the kernel forms, exactly
    torch.testing.assert_close(y.double(), torch.nn.functional.softplus(summed), rtol=2e-6, atol=tiny)

    z = torch.linspace(-200, 200, count).reshape(1, 1, count)
    gate_inputs = dict(
        u=torch.full((1, 1, count), 3.0), delta=torch.zeros(1, 1, count), A=-torch.ones(1, 1),
        B=torch.zeros(1, 1, count), C=torch.zeros(1, 1, count), D=torch.ones(1), z=z,
    )
    y, _ = selective_scan(**gate_inputs, impl="cpp_loop")
    # Below z = -87.3 the kernel's exp flushes to 0 where float64 goes on: |y| < 3 x 200 x tiny there.
    torch.testing.assert_close(y.double(), 3 * torch.nn.functional.silu(z.double()), rtol=2e-6, atol=600 * tiny)


@needs_cpp
def test_cpp_loop_reads_a_strided_gate_in_place() -> None:
    """z as Mamba hands it (a channel-major view of a time-major tensor, with the batch stride of twice the
    channels) gives exactly what its contiguous copy gives."""
    inputs = make_inputs(batch=2, channels=20, length=37, d_state=4)
    xz = torch.randn(2, 37, 40)  # (B, L, 2 D), as in_proj gives
    inputs["z"] = xz[..., 20:].transpose(1, 2)  # (B, D, L), strides (40 L, 1, 40)
    strided, _ = selective_scan(**inputs, impl="cpp_loop")
    copied, _ = selective_scan(**{**inputs, "z": inputs["z"].contiguous()}, impl="cpp_loop")
    assert torch.equal(strided, copied)


@needs_cpp
@pytest.mark.parametrize("reverse", [False, True])
def test_cpp_loop_reads_time_major_views_as_it_reads_copies(reverse: bool) -> None:
    """u, delta, z, B and C as Mamba hands them (time-major views, a step's channels or states adjacent; z and B,
    C slices of wider rows) give exactly what contiguous copies give, y and every gradient, with y, du, ddelta and
    dz time-major as their inputs (200 steps: more than one tile)."""
    inputs = make_inputs(batch=2, channels=20, length=200, d_state=4)
    rows = torch.randn(2, 200, 20 + 2 * 4 + 20)  # (B, L, D + 2 N + D): delta, B, C and z side by side
    rows[..., :20] = inputs["delta"].transpose(1, 2)
    rows[..., 20:24] = inputs["B"].transpose(1, 2)
    rows[..., 24:28] = inputs["C"].transpose(1, 2)
    rows[..., 28:] = inputs["z"].transpose(1, 2)
    views = {"u": inputs["u"].transpose(1, 2).contiguous().transpose(1, 2), "delta": rows[..., :20].transpose(1, 2),
             "B": rows[..., 20:24].transpose(1, 2), "C": rows[..., 24:28].transpose(1, 2),
             "z": rows[..., 28:].transpose(1, 2)}
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]

    def run(given: dict) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        leaves = {k: given[k].detach().clone() if k not in views else given[k].detach() for k in names}
        leaves = {k: v.requires_grad_() for k, v in leaves.items()}
        y, _ = selective_scan(**{**given, **leaves}, impl="cpp_loop", reverse=reverse)
        dy = torch.empty_like(y).copy_(dy_values)  # the same values, laid out as y (as autograd hands them)
        return y, torch.autograd.grad(y, list(leaves.values()), dy)

    dy_values = torch.randn(inputs["u"].shape)

    y_views, grads_views = run({**inputs, **views})
    y_copies, grads_copies = run(inputs)
    assert y_views.stride() == views["u"].stride()
    assert torch.equal(y_views, y_copies)
    for name, g_views, g_copies in zip(names, grads_views, grads_copies):
        assert torch.equal(g_views, g_copies), f"d/d{name} differs"
        if name in ("u", "delta", "z"):  # time-major as their inputs (dense, where delta and z were slices)
            assert g_views.stride(1) == 1 and g_views.is_contiguous() is False, (name, g_views.stride())


@needs_cpp
@pytest.mark.parametrize("name,shape", [("z", (2, 6, 1)), ("delta", (2, 6, 32)), ("D", (1,)), ("B", (2, 5, 32)),
                                        ("delta_bias", (7,))])
def test_cpp_loop_refuses_shapes_it_would_read_past(name: str, shape: tuple[int, ...]) -> None:
    """The kernels read raw memory by u's and A's shapes: a z PyTorch would broadcast, or any input of another
    shape, is refused in one line that names it."""
    inputs = make_inputs(batch=2, channels=6, length=33, d_state=5)
    inputs[name] = torch.randn(shape)
    with pytest.raises(ValueError, match=re.escape(f"{name} {shape}")):
        selective_scan(**inputs, impl="cpp_loop")


@needs_cpp
def test_cpp_loop_opcheck() -> None:
    inputs = make_inputs(length=7, d_state=3)
    args = tuple(inputs.values())
    grad_args = tuple(a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args)
    time_major = tuple(a.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() if i in (0, 1, 3, 4, 6)
                       else a for i, a in enumerate(grad_args))  # u, delta, B, C, z as Mamba's views
    for sample in (args, grad_args, (*args[:5], None, None, None, False), time_major):
        for reverse in (False, True):
            torch.library.opcheck(torch.ops.mixerbench.selective_scan_cpp.default, (*sample, reverse))


def _grid_orders(H: int, W: int) -> torch.Tensor:
    """vmamba's four orders of an H x W grid as the kernel takes them, (4, H W) int64."""
    return torch.tensor(cross_scan_orders(H, W))


@needs_cpp
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shared_u", [True, False])
@pytest.mark.parametrize("grid,d_state", [((1, 1), 1), ((3, 5), 3), ((9, 11), 1), ((8, 8), 2)])
def test_cpp_loop_order_scans_each_group_in_its_own_order(grid: tuple[int, int], d_state: int, shared_u: bool,
                                                          threads: int) -> None:
    """With an order, group g's step t is position order[g, t] of every tensor: equal (float64, to round-off) to
    gathering each group's sequence, the reference scan, and putting its outputs back; forward and every gradient.
    u either one tensor read by all four groups (stride 0, vmamba's) or a (B, D, L) one of its own per group;
    99 steps span two tiles of the kernel."""
    H, W = grid
    L, G, width, batch = H * W, 4, 5, 2
    order = _grid_orders(H, W)
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    u = randn(batch, width, L) if shared_u else randn(batch, G * width, L)
    leaves = dict(u=u, delta=randn(batch, G, width, L), A=(-torch.rand(G * width, d_state, generator=g,
                                                                        dtype=torch.float64) - 0.1).requires_grad_(),
                  B=randn(batch, G, d_state, L), C=randn(batch, G, d_state, L), D=randn(G * width),
                  delta_bias=randn(G * width))

    def ours() -> torch.Tensor:
        u_in = u.unsqueeze(1).expand(batch, G, width, L) if shared_u else u.unflatten(1, (G, width))
        return cpp_scan.selective_scan_cpp_call(u_in, leaves["delta"], leaves["A"], leaves["B"], leaves["C"],
                                                leaves["D"], None, leaves["delta_bias"], True, False, order)

    def reference() -> torch.Tensor:
        ys = []
        for k in range(G):
            o, part = order[k], slice(k * width, (k + 1) * width)
            u_k = u[:, :, o] if shared_u else u[:, part][:, :, o]
            y = selective_scan_reference(u_k, leaves["delta"][:, k][:, :, o], leaves["A"][part],
                                         leaves["B"][:, k][:, :, o], leaves["C"][:, k][:, :, o], leaves["D"][part],
                                         None, leaves["delta_bias"][part], True)
            ys.append(torch.zeros_like(y).index_copy(2, o, y))
        return torch.stack(ys, 1)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = ours()
        dy = torch.randn(y.shape, generator=g, dtype=torch.float64)
        grads = torch.autograd.grad(y, list(leaves.values()), dy)
    finally:
        torch.set_num_threads(before)
    y_ref = reference()
    grads_ref = torch.autograd.grad(y_ref, list(leaves.values()), dy)
    for key, a, b in zip(["y", *leaves], (y, *grads), (y_ref, *grads_ref)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"{key} differs")


@needs_cpp
def test_cpp_loop_refuses_an_order_it_cannot_follow() -> None:
    """An order is read as positions: one past the end, of another shape, or given with `reverse` is refused in
    one line."""
    inputs = make_inputs(batch=2, channels=8, length=6, d_state=2, with_z=False)
    inputs["B"], inputs["C"] = (inputs[k].unsqueeze(1).expand(2, 4, 2, 6) for k in ("B", "C"))
    call = functools.partial(cpp_scan.selective_scan_cpp, *inputs.values())
    call(order=_grid_orders(2, 3))  # the orders of a 2 x 3 grid: fine
    with pytest.raises(ValueError, match=re.escape("order must hold int64 positions in [0, 6)")):
        call(order=_grid_orders(2, 3) + 1)
    with pytest.raises(ValueError, match=re.escape("order (4, 5), expected (4, 6)")):
        call(order=_grid_orders(2, 3)[:, :5])
    with pytest.raises(ValueError, match="an order or reverse, not both"):
        call(order=_grid_orders(2, 3), reverse=True)
    with pytest.raises(ValueError, match=re.escape("dy (2, 8, 5) must be shaped as u (2, 8, 6)")):
        cpp_scan._scan_backward(torch.randn(2, 8, 5), *list(inputs.values())[:8], True, False, _grid_orders(2, 3))


@needs_cpp
def test_cpp_loop_opcheck_with_an_order() -> None:
    """The op's schema, fake and autograd with the order and a u that every group reads (stride 0)."""
    g = torch.Generator().manual_seed(0)
    batch, G, width, d_state, (H, W) = 2, 4, 3, 2, (2, 3)
    u = torch.randn(batch, width, H * W, generator=g).unsqueeze(1).expand(batch, G, width, H * W)
    sample = (u, torch.randn(batch, G, width, H * W, generator=g).requires_grad_(), -torch.rand(G * width, d_state),
              torch.randn(batch, G, d_state, H * W).requires_grad_(), torch.randn(batch, G, d_state, H * W),
              torch.randn(G * width), None, torch.randn(G * width), True, False, _grid_orders(H, W))
    torch.library.opcheck(torch.ops.mixerbench.selective_scan_cpp.default, sample)


def test_auto_falls_back_to_torch_stream_without_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the C++ scan cannot be built, `auto` runs `torch_stream` and says so; `cpp_loop` asked for by name
    raises with the reason."""
    monkeypatch.setattr(cpp_scan, "_library", lambda: "the C++ scan could not be built (no compiler)")
    cpu = torch.device("cpu")
    assert resolve_scan_impl("auto", cpu) == "torch_stream"
    _, name = selective_scan(**make_inputs(length=3))
    assert name == "torch_stream"
    with pytest.raises(RuntimeError, match="no compiler"):
        resolve_scan_impl("cpp_loop", cpu)


@needs_cpp
def test_cpp_loop_builds_without_openmp_where_openmp_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler without OpenMP gets the std::thread build, which computes what the OpenMP build does (forward
    bit for bit; gradients up to the order in which threads' partial sums of dA, dB, dC meet)."""
    inputs = make_inputs(batch=2, channels=40, length=150, d_state=5)
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    dy = torch.randn_like(inputs["u"])

    def run_both_ways() -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        leaves = {k: inputs[k].clone().requires_grad_() for k in names}
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            y, _ = selective_scan(**{**inputs, **leaves}, impl="cpp_loop")
            return y, torch.autograd.grad(y, list(leaves.values()), dy)
        finally:
            torch.set_num_threads(before)

    y_omp, grads_omp = run_both_ways()
    broken = (("omp", ["-fopenmp", "-fno-such-flag-mixerbench"]), cpp_scan._THREADING[1])
    monkeypatch.setattr(cpp_scan, "_THREADING", broken)
    cpp_scan._library.cache_clear()
    try:
        assert "_threads" in str(cpp_scan._library()._name)
        y_threads, grads_threads = run_both_ways()
    finally:
        cpp_scan._library.cache_clear()  # later tests load the default build again
    assert torch.equal(y_omp, y_threads)
    for name, g_omp, g_threads in zip(names, grads_omp, grads_threads):
        torch.testing.assert_close(g_threads, g_omp, rtol=1e-5, atol=1e-6, msg=f"d/d{name} differs")


@pytest.mark.parametrize(("capability", "isa"), [("AVX512", "avx512"), ("AVX2", "avx2"), ("DEFAULT", "baseline")])
def test_cpp_loop_builds_for_the_widest_vectors_torch_found(monkeypatch: pytest.MonkeyPatch, capability: str,
                                                            isa: str) -> None:
    """The build follows torch's own CPU dispatch, and its name says which, so a cache shared by two CPUs never
    loads the other's build."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert cpp_scan._vector_isa()[0] == isa


def _record_scan_inputs(module, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, torch.Tensor]]:
    """The u, delta, B, C every `selective_scan` call of `module` is handed, recorded as they come."""
    seen = []

    def recording_scan(u, delta, A, B, C, *args, **kwargs):
        seen.append({"u": u, "delta": delta, "B": B, "C": C})
        return selective_scan(u, delta, A, B, C, *args, **kwargs)

    monkeypatch.setattr(module, "selective_scan", recording_scan)
    return seen


def test_mamba_hands_the_cpu_scan_time_major_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mamba hands the scan its projections as they come, time-major (a step's channels or states adjacent), with
    no copy to channel-major: the C++ loop reads that layout, and the copies cost a fifth of the mixer's time."""
    import mixers.mamba
    from mixers import create_mixer

    seen = _record_scan_inputs(mixers.mamba, monkeypatch)
    create_mixer("mamba", 16, 2)(torch.randn(2, 3 * 5, 16), (3, 5))
    assert len(seen) == 2
    for call in seen:
        assert all(t.stride(1) == 1 and t.stride(2) > 1 for t in call.values()), {k: t.stride() for k, t in call.items()}


def test_vmamba_hands_the_scan_contiguous_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """On its stacked path (every impl but `cpp_loop`; the GPU kernels read rows along L) vmamba gives the scan
    delta, B and C contiguous along L (issue 34 item 7)."""
    import mixers.vmamba
    from mixers import create_mixer

    seen = _record_scan_inputs(mixers.vmamba, monkeypatch)
    create_mixer("vmamba", 16, 2, scan_impl="torch_stream")(torch.randn(2, 3 * 5, 16), (3, 5))
    assert seen and all(t.is_contiguous() for call in seen for t in call.values())


@pytest.mark.skipif(CPP_PROBLEM is not None, reason=f"cpp_loop: {CPP_PROBLEM}")
def test_vmamba_hands_the_cpu_scan_one_grid_order_u_and_the_orders(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `cpp_loop` vmamba gathers no direction's sequence: the kernel gets one u for all four directions (an
    expanded view), delta, B and C time-major in grid order, and the four scan orders as positions."""
    import mixers.vmamba
    from mixers import create_mixer
    from mixers.vmamba import scan_orders

    seen = []

    def recording(u, delta, A, B, C, D, z, delta_bias, softplus, reverse, order):
        seen.append({"u": u, "delta": delta, "B": B, "C": C, "order": order})
        return selective_scan_cpp_call(u, delta, A, B, C, D, z, delta_bias, softplus, reverse, order)

    monkeypatch.setattr(mixers.vmamba, "selective_scan_cpp_call", recording)
    mixer = create_mixer("vmamba", 16, 2, scan_impl="cpp_loop")
    mixer(torch.randn(2, 3 * 5, 16), (3, 5))
    (call,) = seen
    assert mixer.impl == "cpp_loop"
    assert call["u"].shape == (2, 4, 16, 15) and call["u"].stride(1) == 0
    assert all(call[k].stride(-1) > 1 for k in ("u", "delta", "B", "C")), {k: t.stride() for k, t in call.items()}
    assert torch.equal(call["order"], scan_orders((3, 5), torch.device("cpu")))


@pytest.mark.parametrize("impl", ["mamba_ssm_cuda", "triton"])
def test_gpu_scans_get_rows_along_time_whatever_the_layout(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU kernels read each (channel, state) row along L in coalesced tiles (issue 34 item 7): handed
    time-major views, as Mamba's, they get u, delta, B and C contiguous along L from the dispatch."""
    seen = []

    def kernel(u, delta, A, B, C, *args):
        seen.append((u, delta, B, C))
        return torch.zeros_like(u), None

    if impl == "mamba_ssm_cuda":
        monkeypatch.setattr(scan_module, "_mamba_ssm_selective_scan_fn", lambda: lambda *a: kernel(*a)[0])
    else:
        monkeypatch.setattr(torch.ops.mixerbench, "selective_scan_triton", kernel)
    inputs = make_inputs(batch=2, channels=6, length=9, d_state=3)
    for name in ("u", "delta", "B", "C"):  # time-major copies, handed as (B, *, L) views
        inputs[name] = inputs[name].transpose(1, 2).contiguous().transpose(1, 2)
    scan_module._scan(impl, *inputs.values(), reverse=False)
    assert seen and all(t.stride(-1) == 1 for t in seen[0]), [t.stride() for t in seen[0]]


def test_mamba_ssm_failing_with_other_than_import_error_falls_back(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mamba-ssm whose import raises AttributeError (API drift) is treated as not importable: `auto` passes it
    over with a RuntimeWarning that gives the reason, and asking for `mamba_ssm_cuda` raises one clear error."""
    import mixers.ops.selective_scan as scan_module

    package = tmp_path / "mamba_ssm"
    package.mkdir()
    (package / "__init__.py").write_text("raise AttributeError(\"module 'torch' has no attribute 'gone'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)
    scan_module._mamba_ssm_import.cache_clear()
    scan_module._warn_mamba_ssm_broken.cache_clear()
    try:
        assert "AttributeError" in scan_module.mamba_ssm_unavailable_reason()
        with pytest.warns(RuntimeWarning, match="AttributeError"):
            ran = resolve_scan_impl("auto", torch.device("cuda"))
        assert ran != "mamba_ssm_cuda"
        with pytest.raises(RuntimeError, match="AttributeError"):
            resolve_scan_impl("mamba_ssm_cuda", torch.device("cuda"))
        assert resolve_scan_impl("auto", torch.device("cpu")) in ("cpp_loop", "torch_stream")
    finally:
        scan_module._mamba_ssm_import.cache_clear()
        scan_module._warn_mamba_ssm_broken.cache_clear()


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_grouped_b_and_c_equal_one_scan_per_group(impl: str, reverse: bool) -> None:
    """B, C of shape (B, G, N, L) (vmamba's four directions in one call): channel d reads group d // (D / G).
    Each implementation equals the reference run group by group, forward and every gradient; the reference itself
    takes groups, which the per-group runs check."""
    inputs = make_inputs(2, 12, 37, 3, dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    inputs["B"], inputs["C"] = (torch.randn(2, 4, 3, 37, generator=g, dtype=torch.float64) for _ in range(2))
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    dy = torch.randn_like(inputs["u"])

    def per_group(**kw) -> torch.Tensor:
        part = {"u": 1, "delta": 1, "z": 1, "A": 0, "D": 0, "delta_bias": 0}
        return torch.cat([selective_scan_reference(
            **{k: (v.narrow(part[k], 3 * i, 3) if k in part else v[:, i] if k in ("B", "C") else v)
               for k, v in kw.items()}, reverse=reverse) for i in range(4)], dim=1)

    results = []
    for scan in (per_group, lambda **kw: selective_scan_reference(**kw, reverse=reverse),
                 lambda **kw: selective_scan(**kw, impl=impl, reverse=reverse)[0]):
        leaves = {k: inputs[k].clone().requires_grad_() for k in names}
        y = scan(**{**inputs, **leaves})
        results.append((y, *torch.autograd.grad(y, list(leaves.values()), dy)))
    for got in results[1:]:
        for key, a, b in zip(["y", *names], got, results[0]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"{key} differs")


def test_vmamba_scans_its_four_directions_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """One selective-scan call per forward, over 4 x d_inner channels with B and C grouped by direction."""
    import mixers.vmamba as vmamba_module
    from mixers import create_mixer

    calls = []

    def recording_scan(u, delta, A, B, C, *args, **kwargs):
        calls.append((tuple(u.shape), tuple(B.shape)))
        return selective_scan(u, delta, A, B, C, *args, **kwargs)

    monkeypatch.setattr(vmamba_module, "selective_scan", recording_scan)
    mixer = create_mixer("vmamba", 16, 2, scan_impl="torch_stream")  # the stacked path (cpp_loop: the grid path)
    mixer(torch.randn(2, 3 * 5, 16), (3, 5))
    assert calls == [((2, 4 * mixer.d_inner, 15), (2, 4, mixer.d_state, 15))]


def test_compiled_mamba_takes_the_scan_choice_as_a_constant() -> None:
    """torch.compile runs the choice once while tracing: Dynamo neither traces into the cached import and build
    checks (it warned that it ignores their caches, on every compiled mamba and vmamba) nor changes the result."""
    import warnings

    from mixers import create_mixer

    torch.manual_seed(0)
    mixer = create_mixer("mamba", 32, 2)
    x = torch.randn(2, 16, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(mixer)(x, (4, 4))
    assert not [w for w in caught if "lru_cache" in str(w.message)]
    torch.testing.assert_close(compiled, mixer(x, (4, 4)))
