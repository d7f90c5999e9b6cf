"""The custom op `mixerbench::selective_scan_cpp` (`cpp_loop`): the selective scan as a compiled C++ loop on the CPU.

The stepped PyTorch op (`torch_stream`) pays Python and dispatch per time step; this one runs the whole recurrence,
forward and backward, in `cpp_scan.cpp`: per (sequence, block of channels) a loop over time with the state in a
small buffer, exp(delta A) from a vectorised polynomial, and a backward that recomputes the block's states and
runs the reverse scan (mamba-ssm's design on a CPU). `reverse` is native (the loop runs backwards).

The source is built on first use (`mixers/ops/cpu_kernels.py`). Where it cannot be built (no compiler)
`cpp_unavailable_reason` says why and `auto` falls back to `torch_stream`. Its threads follow
`torch.get_num_threads()`.

The kernels also apply delta's bias and softplus, the D skip and the z gate, and differentiate them, step by step
as they load and store (as mamba-ssm's CUDA kernel does): in PyTorch they were passes over (B, D, L) tensors that
together took about as long as the recurrence.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from einops import rearrange
from torch import Tensor

from .. import cpu_kernels
from ..cpu_kernels import pointer
from ..eager_op import EagerOp
from ..precision import compute_dtype
from .naive import grouped

SOURCE = Path(__file__).with_name("cpp_scan.cpp")
# Bumped with the C entry points' signatures; the library reports it so a stale build is never called.
ABI_VERSION = 7
ENABLE_ENV = cpu_kernels.ENABLE_ENV
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_CTYPE = {torch.float32: "f32", torch.float64: "f64"}
_vector_isa = cpu_kernels.vector_isa
# The builds tried, in order (cpu_kernels.THREADING; a test breaks the first here).
_THREADING = cpu_kernels.THREADING


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The built library, or the reason it cannot be had (cached: a failed build is not retried per call)."""
    entries = [f"mixerbench_scan_{way}_{suffix}" for way in ("fwd", "bwd") for suffix in _CTYPE.values()]
    return cpu_kernels.build("C++ scan", "mixerbench_cpp_scan", SOURCE, ABI_VERSION, "mixerbench_scan_abi_version",
                             entries, _THREADING)


def cpp_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None where `cpp_loop` runs on tensors of `device` and `dtype`, else why not (one line)."""
    if device.type != "cpu":
        return f"the C++ scan runs on CPU tensors, got {device}"
    if dtype not in SUPPORTED_DTYPES:
        return f"the C++ scan takes float tensors (float64, float32, or half types accumulated in float32), got {dtype}"
    return cpu_kernels.failure(_library())


class _Inputs:
    """The kernels' inputs in the compute dtype: u, delta (B, D, L) at the strides given (the kernels apply the bias
    and softplus, and read any layout; Mamba's are time-major views), A (D, N) contiguous, B and C (B, G, N, L) with
    a time step's N values adjacent (as views of Mamba's x_proj output are; other layouts are copied so).

    The kernels read raw memory by these shapes, so the optional z (B, D, L), D and delta_bias (D,) are checked
    here too: a broadcastable z that PyTorch would have taken must not be read past its end.
    """

    def __init__(self, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
                 z: Tensor | None = None, delta_bias: Tensor | None = None) -> None:
        if u.dim() != 3 or A.dim() != 2:
            raise ValueError(f"cpp_loop scan: u must be (B, D, L) and A (D, N), got {tuple(u.shape)} and "
                             f"{tuple(A.shape)}")
        (batch, channels, length), d_state = u.shape, A.shape[1]
        groups = B.shape[1] if B.dim() == 4 else 1
        bc = (batch, groups, d_state, length) if B.dim() == 4 else (batch, d_state, length)
        expected = {"delta": (delta, (batch, channels, length)), "A": (A, (channels, d_state)), "B": (B, bc),
                    "C": (C, bc), "z": (z, (batch, channels, length)), "D": (D, (channels,)),
                    "delta_bias": (delta_bias, (channels,))}
        wrong = [f"{name} {tuple(t.shape)}, expected {shape}" for name, (t, shape) in expected.items()
                 if t is not None and tuple(t.shape) != shape]
        if channels % groups:
            wrong.append(f"B's {groups} groups do not divide the {channels} channels")
        if wrong:
            raise ValueError(f"cpp_loop scan: shapes do not fit u {tuple(u.shape)} and A {tuple(A.shape)}: "
                             + "; ".join(wrong))
        ct = compute_dtype(u)
        self.dtype = ct
        self.u = u.to(ct)  # (B, D, L), its strides kept
        self.delta = delta.to(ct)  # (B, D, L), its strides kept
        self.A = A.to(ct).contiguous()  # (D, N)
        self.B = _states_adjacent(grouped(B.to(ct)))  # (B, G, N, L)
        self.C = _states_adjacent(grouped(C.to(ct)))  # (B, G, N, L)
        self.shape = (batch, channels, length, d_state, groups)  # as checked above
        self.suffix = _CTYPE[ct]

    def args(self, **others: Tensor | None) -> tuple:
        """The entry points' leading arguments: the sizes, the strides of every (B, D, L) tensor (u, delta and
        `others` by slot name: z, y, dy, du, ddelta, dz) and of B and C, then the pointers of u, delta, A, B, C."""
        sizes = tuple(ctypes.c_int64(s) for s in self.shape)
        strides = {"u": self.u.stride(), "delta": self.delta.stride(), "B": _bc_strides(self.B),
                   "C": _bc_strides(self.C)}
        strides.update({name: t.stride() for name, t in others.items() if t is not None})
        flat = [s for slot in _SLOTS for s in strides.get(slot, (0, 0, 0))]
        return (*sizes, (ctypes.c_int64 * len(flat))(*flat),
                *(pointer(t) for t in (self.u, self.delta, self.A, self.B, self.C)))


# The order of cpp_scan.cpp's `Slot`: a (batch, channel or group, time) stride triple each.
_SLOTS = ("u", "delta", "z", "B", "C", "y", "dy", "du", "ddelta", "dz")


def _states_adjacent(t: Tensor) -> Tensor:
    """B or C (B, G, N, L) with a step's N values adjacent (stride 1 along N), copied so only where they are not."""
    return t if t.stride(2) == 1 or t.shape[2] == 1 else t.transpose(2, 3).contiguous().transpose(2, 3)


def _bc_strides(t: Tensor) -> tuple[int, int, int]:
    """B's or C's (batch, group, time) strides; along N it is 1 (`_states_adjacent`)."""
    return t.stride(0), t.stride(1), t.stride(3)


def _optional(t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    return None if t is None else t.to(dtype).contiguous()


def selective_scan_cpp(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    *,
    reverse: bool = False,
) -> Tensor:
    """The selective scan without autograd through the compiled loop (the custom op's forward).

    Arguments as `selective_scan_reference`; CPU tensors, float64 computed in float64, others in float32.

    Returns:
        y (B, D, L) in `u.dtype`, laid out as u (time-major where u is).
    """
    with torch.no_grad():
        p = _Inputs(u, delta, A, B, C, D, z, delta_bias)
        bias, skip = (_optional(t, p.dtype) for t in (delta_bias, D))
        gate = None if z is None else z.to(p.dtype)  # any strides: the kernel reads them
        y = torch.empty_like(p.u)  # (B, D, L), u's layout
        getattr(cpu_kernels.loaded(_library()), f"mixerbench_scan_fwd_{p.suffix}")(
            *p.args(z=gate, y=y), pointer(bias), ctypes.c_int(int(delta_softplus)), pointer(skip), pointer(gate),
            pointer(y), ctypes.c_int(int(reverse)), cpu_kernels.threads(),
        )
        return y.to(u.dtype)


def _scan_backward(
    dy: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, z: Tensor | None,
    delta_bias: Tensor | None, delta_softplus: bool, reverse: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The kernel's backward as an op of its own (so autograd tracing, e.g. opcheck or torch.compile, sees an
    opaque op with a fake, not a data pointer): the gradients of the selective scan's output with respect to u,
    delta, A, B, C, D, z and delta_bias, in the compute dtype. Where D, z or delta_bias is None its gradient is an
    empty tensor (an op returns tensors only).

    Returns:
        (du, d_delta, dA, dB, dC, dD, dz, d_bias), shaped as the inputs; du, d_delta and dz laid out as u, delta
        and z, the others contiguous.
    """
    p = _Inputs(u, delta, A, B, C, D, z, delta_bias)
    batch, channels, length, d_state, groups = p.shape
    threads = cpu_kernels.threads()
    bias, skip = (_optional(t, p.dtype) for t in (delta_bias, D))
    gate = None if z is None else z.to(p.dtype)  # any strides: the kernel reads them
    dy = dy.to(p.dtype)  # (B, D, L), any strides
    du = torch.empty_like(p.u)  # (B, D, L), as u
    d_delta = torch.empty_like(p.delta)  # (B, D, L), as delta
    dz = torch.empty_like(gate) if gate is not None else p.u.new_empty(0)  # (B, D, L), as z
    dA_part = p.u.new_zeros(threads.value, channels, d_state)  # per thread, (T, D, N)
    dB_part = p.u.new_zeros(threads.value, batch, groups, length, d_state)  # per thread, (T, B, G, L, N)
    dC_part = p.u.new_zeros(threads.value, batch, groups, length, d_state)  # per thread, (T, B, G, L, N)
    dD_part = p.u.new_zeros(threads.value, channels)  # per thread, (T, D)
    dbias_part = p.u.new_zeros(threads.value, channels)  # per thread, (T, D)
    getattr(cpu_kernels.loaded(_library()), f"mixerbench_scan_bwd_{p.suffix}")(
        *p.args(z=gate, dy=dy, du=du, ddelta=d_delta, dz=dz if gate is not None else None), pointer(bias),
        ctypes.c_int(int(delta_softplus)), pointer(skip), pointer(gate), pointer(dy),
        *(pointer(t) for t in (du, d_delta, dA_part, dB_part, dC_part, dD_part, dbias_part)),
        pointer(dz if z is not None else None), ctypes.c_int(int(reverse)), threads,
    )
    dB = rearrange(dB_part.sum(0), "b g l n -> b g n l").reshape(B.shape).contiguous()  # as B
    dC = rearrange(dC_part.sum(0), "b g l n -> b g n l").reshape(C.shape).contiguous()  # as C
    dD = dD_part.sum(0) if D is not None else p.u.new_empty(0)
    d_bias = dbias_part.sum(0) if delta_bias is not None else p.u.new_empty(0)
    return du, d_delta, dA_part.sum(0), dB, dC, dD, dz, d_bias


_scan_backward_op = torch.library.custom_op("mixerbench::selective_scan_cpp_bwd", _scan_backward, mutates_args=())
_scan_backward_call = EagerOp(_scan_backward_op, _scan_backward)


@_scan_backward_op.register_fake
def _scan_backward_fake(
    dy: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, z: Tensor | None,
    delta_bias: Tensor | None, delta_softplus: bool, reverse: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    ct = compute_dtype(u)

    def like(t: Tensor | None, layout: bool) -> Tensor:  # du, d_delta and dz keep their inputs' layouts
        if t is None:
            return u.new_empty(0, dtype=ct)
        return torch.empty_like(t, dtype=ct) if layout else t.new_empty(t.shape, dtype=ct)

    return (like(u, True), like(delta, True), like(A, False), like(B, False), like(C, False), like(D, False),
            like(z, True), like(delta_bias, False))


def _cpp_backward(dy: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
                  z: Tensor | None, delta_bias: Tensor | None, delta_softplus: bool,
                  reverse: bool) -> tuple[Tensor | None, ...]:
    """Gradients (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) in the inputs' dtypes, None where the input was
    None."""
    grads = _scan_backward_call(dy, u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse)
    inputs = (u, delta, A, B, C, D, z, delta_bias)
    return tuple(None if t is None else g.to(t.dtype) for g, t in zip(grads, inputs))


def _selective_scan_cpp_impl(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
    reverse: bool,
) -> Tensor:
    return selective_scan_cpp(u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse=reverse)


_selective_scan_cpp_op = torch.library.custom_op("mixerbench::selective_scan_cpp", _selective_scan_cpp_impl,
                                                 mutates_args=())


@_selective_scan_cpp_op.register_fake
def _selective_scan_cpp_fake(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
    reverse: bool,
) -> Tensor:
    return torch.empty_like(u)  # the real op's y is laid out as u


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse = inputs
    ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias)
    ctx.delta_softplus = delta_softplus
    ctx.reverse = reverse


def _backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:
    u, delta, A, B, C, D, z, delta_bias = ctx.saved_tensors
    with torch.no_grad():
        grads = _cpp_backward(dy, u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus, ctx.reverse)
    return (*grads, None, None)


# What `selective_scan` calls: the op, or in plain eager on the CPU the same functions without the dispatcher; the
# op's autograd is registered here too.
selective_scan_cpp_call = EagerOp(_selective_scan_cpp_op, _selective_scan_cpp_impl, _setup_context, _backward)
