"""The token conv's forward and its whole backward, each as one compiled pass on the CPU (`cpp_conv.cpp`), for
float32 and float64; `runs` says where it applies, elsewhere the op runs its PyTorch form (`shifted.py`)."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from .. import cpu_kernels
from ..cpu_kernels import pointer

SOURCE = Path(__file__).with_name("cpp_conv.cpp")
# Bumped with the C entry points' signatures; the library reports it so a stale build is never called.
ABI_VERSION = 3
_CTYPE = {torch.float32: "f32", torch.float64: "f64"}


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The built library, or the reason it cannot be had (cached: a failed build is not retried per call)."""
    entries = [f"mixerbench_token_conv_{way}_{suffix}" for way in ("fwd", "bwd") for suffix in _CTYPE.values()]
    return cpu_kernels.build("C++ token conv", "mixerbench_token_conv", SOURCE, ABI_VERSION,
                             "mixerbench_token_conv_abi_version", entries)


def unavailable_reason() -> str | None:
    """None where the library is built, else why not (one line)."""
    return cpu_kernels.failure(_library())


def runs(*tensors: Tensor | None) -> bool:
    """Whether the compiled conv takes these tensors: all on the CPU in one of float32 and float64, and built."""
    return cpu_kernels.takes(tensors, _CTYPE, unavailable_reason)


def _leading(x: Tensor, weight: Tensor, left: int) -> tuple:
    """The sizes and x's pointer and (batch, time) strides; x's channels must be adjacent
    (`cpu_kernels.last_adjacent`)."""
    batch, length, channels = x.shape
    sizes = (batch, length, channels, weight.shape[-1], left)
    return (*(ctypes.c_int64(v) for v in sizes), pointer(x), ctypes.c_int64(x.stride(0)), ctypes.c_int64(x.stride(1)))


def conv(x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool = False) -> Tensor:
    """The conv (token_conv's definition), contiguous (B, L, C); then silu where `silu`."""
    x = cpu_kernels.last_adjacent(x)  # a projection's slice as it is
    taps = weight[:, 0, :].t().contiguous()  # (K, C)
    bias = None if bias is None else bias.contiguous()
    out = x.new_empty(x.shape)
    getattr(cpu_kernels.loaded(_library()), f"mixerbench_token_conv_fwd_{_CTYPE[x.dtype]}")(
        *_leading(x, weight, left), pointer(taps), pointer(bias), ctypes.c_int(int(silu)), pointer(out),
        cpu_kernels.threads(),
    )
    return out


def backward(grad: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool
             ) -> tuple[Tensor, Tensor, Tensor | None]:
    """(dx, dweight, dbias) given the output's gradient (B, L, C), in one compiled pass (`backward` in
    cpp_conv.cpp): through silu at the recomputed output where `silu`; dx contiguous (B, L, C), dweight (C, 1, K),
    dbias (C,) or None without a bias."""
    x, grad = cpu_kernels.last_adjacent(x), grad.contiguous()
    taps = weight[:, 0, :].t().contiguous()  # (K, C)
    bias = None if bias is None else bias.contiguous()
    threads = cpu_kernels.threads()
    width, channels = weight.shape[-1], x.shape[-1]
    dx = x.new_empty(x.shape)
    part_w = x.new_zeros(threads.value, width, channels)  # per thread, summed below
    part_b = x.new_zeros(threads.value, channels)
    getattr(cpu_kernels.loaded(_library()), f"mixerbench_token_conv_bwd_{_CTYPE[x.dtype]}")(
        *_leading(x, weight, left), pointer(taps), pointer(bias), ctypes.c_int(int(silu)), pointer(grad), pointer(dx),
        pointer(part_w), pointer(part_b), threads,
    )
    dweight = part_w.sum(0).t().contiguous().unsqueeze(1)  # (C, 1, K), contiguous as the op's fake promises
    return dx, dweight, None if bias is None else part_b.sum(0)
