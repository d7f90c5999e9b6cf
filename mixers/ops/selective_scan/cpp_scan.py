"""The custom op `mixerbench::selective_scan_cpp` (`cpp_loop`): the selective scan as a compiled C++ loop on the CPU.

The stepped PyTorch op (`torch_stream`) pays Python and dispatch per time step; this one runs the whole recurrence,
forward and backward, in `cpp_scan.cpp`: per (sequence, block of channels) a loop over time with the state in a
small buffer, exp(delta A) from a vectorised polynomial, and a backward that recomputes the block's states and
runs the reverse scan (mamba-ssm's design on a CPU). `reverse` is native (the loop runs backwards), and so is an
`order`: each channel group scans the sequence in its own order of positions, its tensors left where they are
(vmamba's four cross-scan directions over one grid-order tensor).

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
import math
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
ABI_VERSION = 8
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
    """The kernels' inputs in the compute dtype: u, delta (B, D, L) or (B, G, D / G, L) at the strides given (the
    kernels apply the bias and softplus, and read any layout; Mamba's are time-major views; a group stride of 0, an
    expanded u, lets every group read one tensor), A (D, N) contiguous, B and C (B, G, N, L) with a time step's N
    values adjacent (as views of Mamba's x_proj output are; other layouts are copied so), and an optional order
    (G, L): the position along L of each group's steps.

    The kernels read raw memory by these shapes and positions, so the optional z (shaped as u), D and delta_bias
    (D,) and the order are checked here too: a broadcastable z that PyTorch would have taken, or a position past the
    end, must not be read.
    """

    def __init__(self, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None = None,
                 z: Tensor | None = None, delta_bias: Tensor | None = None, order: Tensor | None = None) -> None:
        if u.dim() not in (3, 4) or A.dim() != 2:
            raise ValueError(f"cpp_loop scan: u must be (B, D, L) or (B, G, D / G, L) and A (D, N), got "
                             f"{tuple(u.shape)} and {tuple(A.shape)}")
        batch, length, channels, d_state = u.shape[0], u.shape[-1], math.prod(u.shape[1:-1]), A.shape[1]
        groups = u.shape[1] if u.dim() == 4 else B.shape[1] if B.dim() == 4 else 1
        bc = (batch, groups, d_state, length) if B.dim() == 4 or u.dim() == 4 else (batch, d_state, length)
        expected = {"delta": (delta, tuple(u.shape)), "A": (A, (channels, d_state)), "B": (B, bc),
                    "C": (C, bc), "z": (z, tuple(u.shape)), "D": (D, (channels,)),
                    "delta_bias": (delta_bias, (channels,)), "order": (order, (groups, length))}
        wrong = [f"{name} {tuple(t.shape)}, expected {shape}" for name, (t, shape) in expected.items()
                 if t is not None and tuple(t.shape) != shape]
        if channels % groups:
            wrong.append(f"B's {groups} groups do not divide the {channels} channels")
        if order is not None and order.numel() and (order.dtype != torch.int64 or order.min() < 0
                                                     or order.max() >= length):
            wrong.append(f"order must hold int64 positions in [0, {length}), got {order.dtype} in "
                         f"[{order.min().item()}, {order.max().item()}]")
        if wrong:
            raise ValueError(f"cpp_loop scan: shapes do not fit u {tuple(u.shape)} and A {tuple(A.shape)}: "
                             + "; ".join(wrong))
        self.order = None if order is None else order.contiguous()
        ct = compute_dtype(u)
        self.dtype = ct
        self.u = u.to(ct)  # (B, D, L) or (B, G, D / G, L), its strides kept
        self.delta = delta.to(ct)  # as u, its strides kept
        self.A = A.to(ct).contiguous()  # (D, N)
        self.B = _states_adjacent(grouped(B.to(ct)))  # (B, G, N, L)
        self.C = _states_adjacent(grouped(C.to(ct)))  # (B, G, N, L)
        self.shape = (batch, channels, length, d_state, groups)  # as checked above
        self.suffix = _CTYPE[ct]

    def args(self, **others: Tensor | None) -> tuple:
        """The entry points' leading arguments: the sizes, the strides of every tensor shaped as u (u, delta and
        `others` by slot name: z, y, dy, du, ddelta, dz) and of B and C, then the pointers of u, delta, A, B, C."""
        sizes = tuple(ctypes.c_int64(s) for s in self.shape)
        strides = {"u": self._grouped_strides(self.u), "delta": self._grouped_strides(self.delta),
                   "B": _bc_strides(self.B), "C": _bc_strides(self.C)}
        strides.update({name: self._grouped_strides(t) for name, t in others.items() if t is not None})
        flat = [s for slot in _SLOTS for s in strides.get(slot, (0, 0, 0, 0))]
        return (*sizes, (ctypes.c_int64 * len(flat))(*flat),
                *(pointer(t) for t in (self.u, self.delta, self.A, self.B, self.C)))

    def _grouped_strides(self, t: Tensor) -> tuple[int, int, int, int]:
        """(batch, group, channel, time) strides of a tensor shaped as u; a (B, D, L) one's groups are runs of D / G
        channels."""
        if t.dim() == 4:
            return t.stride()
        return t.stride(0), self.shape[1] // self.shape[4] * t.stride(1), t.stride(1), t.stride(2)


# The order of cpp_scan.cpp's `Slot`: a (batch, group, channel, time) stride quadruple each (B and C: no channel).
_SLOTS = ("u", "delta", "z", "B", "C", "y", "dy", "du", "ddelta", "dz")


def _states_adjacent(t: Tensor) -> Tensor:
    """B or C (B, G, N, L) with a step's N values adjacent (stride 1 along N), copied so only where they are not."""
    return t if t.stride(2) == 1 or t.shape[2] == 1 else t.transpose(2, 3).contiguous().transpose(2, 3)


def _bc_strides(t: Tensor) -> tuple[int, int, int, int]:
    """B's or C's (batch, group, unused, time) strides; along N it is 1 (`_states_adjacent`)."""
    return t.stride(0), t.stride(1), 0, t.stride(3)


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
    order: Tensor | None = None,
) -> Tensor:
    """The selective scan without autograd through the compiled loop (the custom op's forward).

    Arguments as `selective_scan_reference`; CPU tensors, float64 computed in float64, others in float32. u, delta
    and z may also be (B, G, D / G, L), a group's channels on their own axis (its stride 0 where the groups read one
    tensor), with B and C (B, G, N, L).

    Args:
        reverse: scan from the last step to the first.
        order: (G, L) int64 or None: group g's step t is position order[g, t] along L of every tensor (u, delta, z,
            B, C and y), so each group scans its own permutation of one sequence; exclusive with `reverse` (a
            reversed order is an order).

    Returns:
        y shaped as u in `u.dtype`, laid out as delta (time-major where delta is; delta is dense where u may be a
        broadcast).
    """
    if order is not None and reverse:
        raise ValueError("cpp_loop scan: give an order or reverse, not both (reverse the order instead)")
    with torch.no_grad():
        p = _Inputs(u, delta, A, B, C, D, z, delta_bias, order)
        bias, skip = (_optional(t, p.dtype) for t in (delta_bias, D))
        gate = None if z is None else z.to(p.dtype)  # any strides: the kernel reads them
        y = torch.empty_like(p.delta)  # shaped as u, delta's layout
        getattr(cpu_kernels.loaded(_library()), f"mixerbench_scan_fwd_{p.suffix}")(
            *p.args(z=gate, y=y), pointer(bias), ctypes.c_int(int(delta_softplus)), pointer(skip), pointer(gate),
            pointer(y), ctypes.c_int(int(reverse)), pointer(p.order), cpu_kernels.threads(),
        )
        return y.to(u.dtype)


def _scan_backward(
    dy: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, z: Tensor | None,
    delta_bias: Tensor | None, delta_softplus: bool, reverse: bool, order: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The kernel's backward as an op of its own (so autograd tracing, e.g. opcheck or torch.compile, sees an
    opaque op with a fake, not a data pointer): the gradients of the selective scan's output with respect to u,
    delta, A, B, C, D, z and delta_bias, in the compute dtype. Where D, z or delta_bias is None its gradient is an
    empty tensor (an op returns tensors only).

    Returns:
        (du, d_delta, dA, dB, dC, dD, dz, d_bias), shaped as the inputs; du and d_delta laid out as delta, dz as z,
        the others contiguous.
    """
    p = _Inputs(u, delta, A, B, C, D, z, delta_bias, order)
    if dy.shape != u.shape:  # read by u's shape, as the inputs
        raise ValueError(f"cpp_loop scan: dy {tuple(dy.shape)} must be shaped as u {tuple(u.shape)}")
    batch, channels, length, d_state, groups = p.shape
    threads = cpu_kernels.threads()
    bias, skip = (_optional(t, p.dtype) for t in (delta_bias, D))
    gate = None if z is None else z.to(p.dtype)  # any strides: the kernel reads them
    dy = dy.to(p.dtype)  # shaped as u, any strides (a broadcast where the groups' outputs were summed)
    du = torch.empty_like(p.delta)  # shaped as u, as delta: dense where u may be a broadcast
    d_delta = torch.empty_like(p.delta)
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
        pointer(dz if z is not None else None), ctypes.c_int(int(reverse)), pointer(p.order), threads,
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
    delta_bias: Tensor | None, delta_softplus: bool, reverse: bool, order: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    ct = compute_dtype(u)

    def like(t: Tensor | None, layout: bool) -> Tensor:  # du and d_delta are laid out as delta, dz as z
        if t is None:
            return u.new_empty(0, dtype=ct)
        return torch.empty_like(t, dtype=ct) if layout else t.new_empty(t.shape, dtype=ct)

    return (like(delta, True), like(delta, True), like(A, False), like(B, False), like(C, False), like(D, False),
            like(z, True), like(delta_bias, False))


def _cpp_backward(dy: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
                  z: Tensor | None, delta_bias: Tensor | None, delta_softplus: bool, reverse: bool,
                  order: Tensor | None = None) -> tuple[Tensor | None, ...]:
    """Gradients (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) in the inputs' dtypes, None where the input was
    None."""
    grads = _scan_backward_call(dy, u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse, order)
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
    order: Tensor | None = None,
) -> Tensor:
    return selective_scan_cpp(u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse=reverse, order=order)


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
    order: Tensor | None = None,
) -> Tensor:
    return torch.empty_like(delta)  # the real op's y is shaped as u, laid out as delta


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse, *order = inputs
    ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, *order)
    ctx.delta_softplus = delta_softplus
    ctx.reverse = reverse


def _backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:
    u, delta, A, B, C, D, z, delta_bias, *order = ctx.saved_tensors
    with torch.no_grad():
        grads = _cpp_backward(dy, u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus, ctx.reverse, *order)
    return (*grads, None, None, *(None for _ in order))  # as many as the inputs given (order is optional)


# What `selective_scan` calls: the op, or in plain eager on the CPU the same functions without the dispatcher; the
# op's autograd is registered here too.
selective_scan_cpp_call = EagerOp(_selective_scan_cpp_op, _selective_scan_cpp_impl, _setup_context, _backward)
