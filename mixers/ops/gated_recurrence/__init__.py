"""The gated linear recurrence as one compiled loop on the CPU (`cpp_recurrence.cpp`), forward and backward:

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = scale * S_t^T q_t,    S_0 = 0

GLA's recurrence (one log decay per key, `mixers/ops/gla/cpp_gla.py`) and SSD's (one per head, with B and C shared
by the heads, `mixers/ops/ssd/cpp_ssd.py`) are both this one; those files hold the ops, their counters and their
autograd, this one the library and the calls. Every tensor is passed as a (direction, batch, head, time, last) view
with its last dimension adjacent. Direction 1, where there is one, runs from the sequence's last step to its first
and writes its outputs in the sequence's order: a bidirectional mixer's two directions are one call on unflipped
tensors. A stride of 0 shares a tensor among the directions or the heads, a gate of width 1 is one decay for all
keys, so none is copied; an optional value scale s (one per row and step) makes the values s_t v_t, so SSD's x dt
is formed in the loop rather than as a tensor.

Built on first use (`mixers/ops/cpu_kernels.py`); where it cannot be built `unavailable_reason` says why and the
mixers run their chunked PyTorch forms.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from .. import cpu_kernels
from ..cpu_kernels import pointer

SOURCE = Path(__file__).with_name("cpp_recurrence.cpp")
# Bumped with the C entry points' signatures; the library reports it so a stale build is never called.
ABI_VERSION = 3
_CTYPE = {torch.float32: "f32", torch.float64: "f64"}


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The built library, or the reason it cannot be had (cached: a failed build is not retried per call)."""
    entries = [f"mixerbench_gated_recurrence_{way}_{suffix}" for way in ("fwd", "bwd") for suffix in _CTYPE.values()]
    return cpu_kernels.build("C++ gated recurrence", "mixerbench_gated_recurrence", SOURCE, ABI_VERSION,
                             "mixerbench_gated_recurrence_abi_version", entries)


# Compiled, the answer is taken once while tracing and kept as a constant: Dynamo would otherwise trace into the
# cached build below, warning that it ignores its cache, on every graph.
@torch.compiler.assume_constant_result
def unavailable_reason(device: torch.device) -> str | None:
    """None where the compiled recurrence runs on tensors of `device`, else why not (one line)."""
    if device.type != "cpu":
        return f"the C++ gated recurrence runs on CPU tensors, got {device}"
    return cpu_kernels.failure(_library())


def _call_args(q: Tensor, k: Tensor, v: Tensor, vs: Tensor | None, g: Tensor, o: Tensor,
               grads: tuple[Tensor, ...] = (), dvs: Tensor | None = None) -> tuple:
    """Sizes, the strides array and the pointers of q, k, v, vs, g, as the entry points take them. The strides array
    has a slot per tensor of the kernel's `Slot` (q, k, v, g, o, do, dq, dk, dv, dg, vs, dvs); `grads` fills do to
    dg (the backward's), the forward leaves them o's, as it does vs's and dvs's where they are None."""
    directions, batch, heads, length, keys = q.shape
    views = (q, k, v, g, o, *(grads or (o,) * 5), o if vs is None else vs, o if dvs is None else dvs)
    strides = (ctypes.c_int64 * (4 * len(views)))(*(s for t in views for s in t.stride()[:4]))
    sizes = (directions, batch, heads, length, keys, v.shape[-1], g.shape[-1])
    return (*(ctypes.c_int64(s) for s in sizes), strides, *(pointer(t) for t in (q, k, v, vs, g)))


def forward_into(out: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float,
                 value_scale: Tensor | None = None) -> None:
    """Writes the recurrence's outputs o into `out`.

    Args:
        out: (D, B, H, L, V), written.
        q, k: (D, B, H, L, K).
        v: (D, B, H, L, V).
        g: log decays (D, B, H, L, K) or (D, B, H, L, 1), <= 0 for a decaying state.
        scale: multiplies q.
        value_scale: None, or s (D, B, H, L, 1): the values are then s_t v_t.
        D is 1 (causal) or 2 (causal, then anti-causal); all in one of float32 and float64, on the CPU, each with
        its last dimension adjacent (`cpu_kernels.last_adjacent`).
    """
    getattr(cpu_kernels.loaded(_library()), f"mixerbench_gated_recurrence_fwd_{_CTYPE[q.dtype]}")(
        *_call_args(q, k, v, value_scale, g, out), ctypes.c_double(scale), pointer(out), cpu_kernels.threads())


def backward_into(dq: Tensor, dk: Tensor, dv: Tensor, dg: Tensor, dout: Tensor, q: Tensor, k: Tensor, v: Tensor,
                  g: Tensor, scale: float, value_scale: Tensor | None = None,
                  dvalue_scale: Tensor | None = None) -> None:
    """Writes the gradients of q, k, v and g (and of the value scale, into `dvalue_scale`, where one is given) given
    the outputs' `dout`; each gradient shaped as its input but with a row per (direction, sequence, head) even where
    the input is shared (the caller sums those)."""
    getattr(cpu_kernels.loaded(_library()), f"mixerbench_gated_recurrence_bwd_{_CTYPE[q.dtype]}")(
        *_call_args(q, k, v, value_scale, g, dout, (dout, dq, dk, dv, dg), dvalue_scale), ctypes.c_double(scale),
        *(pointer(t) for t in (dout, dq, dk, dv, dvalue_scale, dg)), cpu_kernels.threads())
