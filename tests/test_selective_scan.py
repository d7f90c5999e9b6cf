"""Parity of the pure-PyTorch selective scans with the float64 reference, and the custom op's registrations."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mixers.base import CUSTOM_OP_MACS
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
FAST_IMPLS = ["torch_stream", "torch_loop"]


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
    """`reverse=True` (flipped around the pure-PyTorch impls) equals the reference's loop run from the last step
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
        y, _ = selective_scan(**inputs)
    expected = {torch.ops.mixerbench.selective_scan: selective_scan_flops(2, 6, 9, 5)}
    assert counter.get_flop_counts()["Global"] == expected
    y.sum().backward()
    assert u.grad is not None


def test_impl_resolution_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert resolve_scan_impl("auto", cpu) == "torch_stream"
    assert resolve_scan_impl("torch_loop", cpu) == "torch_loop"
    with pytest.raises(RuntimeError, match="mamba_ssm_cuda"):
        resolve_scan_impl("mamba_ssm_cuda", cpu)
    with pytest.raises(ValueError, match="unknown scan impl"):
        resolve_scan_impl("cuda_magic", cpu)
    meta = torch.device("meta")  # shapes only: routed to ops with fakes and the flop formula
    assert [resolve_scan_impl(i, meta) for i in SCAN_IMPLS] == [
        "torch_stream", "torch_stream", "triton", "torch_stream", "torch_loop"]
    _, name = selective_scan(**make_inputs(length=3))
    assert name == "torch_stream"
