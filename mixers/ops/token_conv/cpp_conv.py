"""The token conv's forward and weight gradient as one compiled pass on the CPU (`cpp_conv.cpp`), for float32 and
float64; `runs` says where it applies, elsewhere the op runs its PyTorch form (`shifted.py`)."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from .. import cpu_kernels

SOURCE = Path(__file__).with_name("cpp_conv.cpp")
# Bumped with the C entry points' signatures; the library reports it so a stale build is never called.
ABI_VERSION = 2
_CTYPE = {torch.float32: "f32", torch.float64: "f64"}


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The built library, or the reason it cannot be had (cached: a failed build is not retried per call)."""
    entries = [f"mixerbench_token_conv_{way}_{suffix}" for way in ("fwd", "dweight") for suffix in _CTYPE.values()]
    return cpu_kernels.build("C++ token conv", "mixerbench_token_conv", SOURCE, ABI_VERSION,
                             "mixerbench_token_conv_abi_version", entries)


def unavailable_reason() -> str | None:
    """None where the library is built, else why not (one line)."""
    lib = _library()
    return lib if isinstance(lib, str) else None


def runs(*tensors: Tensor | None) -> bool:
    """Whether the compiled conv takes these tensors: all on the CPU in one of float32 and float64, and built."""
    given = [t for t in tensors if t is not None]
    dtype = given[0].dtype
    return (dtype in _CTYPE and all(t.device.type == "cpu" and t.dtype == dtype for t in given)
            and unavailable_reason() is None)


def _ptr(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if t is None else t.data_ptr())


def _leading(x: Tensor, weight: Tensor, left: int) -> tuple:
    """The sizes and x's pointer and (batch, time) strides; x's channels must be adjacent
    (`cpu_kernels.last_adjacent`)."""
    batch, length, channels = x.shape
    sizes = (batch, length, channels, weight.shape[-1], left)
    return (*(ctypes.c_int64(v) for v in sizes), _ptr(x), ctypes.c_int64(x.stride(0)), ctypes.c_int64(x.stride(1)))


def conv(x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool = False,
         silu_grad_of: Tensor | None = None) -> Tensor:
    """The conv (token_conv's definition), contiguous (B, L, C); then silu where `silu`, or, given
    `silu_grad_of` (B, L, C), that gradient through silu at the conv's output (silu's backward)."""
    x = cpu_kernels.last_adjacent(x)  # a projection's slice as it is
    taps = weight[:, 0, :].t().contiguous()  # (K, C)
    bias = None if bias is None else bias.contiguous()
    grad = None if silu_grad_of is None else silu_grad_of.contiguous()
    activation = 2 if grad is not None else int(silu)  # the kernel's Activation
    out = x.new_empty(x.shape)
    getattr(cpu_kernels.loaded(_library()), f"mixerbench_token_conv_fwd_{_CTYPE[x.dtype]}")(
        *_leading(x, weight, left), _ptr(taps), _ptr(bias), ctypes.c_int(activation), _ptr(grad), _ptr(out),
        cpu_kernels.threads(),
    )
    return out


def weight_grad(grad: Tensor, x: Tensor, weight: Tensor, left: int) -> Tensor:
    """The weight's gradient (C, 1, K) given the output's."""
    x, grad = cpu_kernels.last_adjacent(x), grad.contiguous()
    threads = cpu_kernels.threads()
    part = x.new_zeros(threads.value, weight.shape[-1], x.shape[-1])  # per thread, (T, K, C)
    getattr(cpu_kernels.loaded(_library()), f"mixerbench_token_conv_dweight_{_CTYPE[x.dtype]}")(
        *_leading(x, weight, left), _ptr(grad), _ptr(part), threads
    )
    # Contiguous, as the op's fake promises: compiled training asserts the strides of a custom op's outputs, and
    # the transposed sum (strides (1, K, C)) failed there.
    return part.sum(0).t().contiguous().unsqueeze(1)  # (C, 1, K)
