"""The gated RMSNorm's forward and backward as one compiled pass over each row on the CPU (`cpp_norm_gate.cpp`), for
float32 and float64; `runs` says where it applies, elsewhere the op runs its PyTorch form (`reference.py`)."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from .. import cpu_kernels
from ..cpu_kernels import pointer

SOURCE = Path(__file__).with_name("cpp_norm_gate.cpp")
# Bumped with the C entry points' signatures; the library reports it so a stale build is never called.
ABI_VERSION = 1
_CTYPE = {torch.float32: "f32", torch.float64: "f64"}


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The built library, or the reason it cannot be had (cached: a failed build is not retried per call)."""
    entries = [f"mixerbench_norm_gate_{way}_{suffix}" for way in ("fwd", "bwd") for suffix in _CTYPE.values()]
    return cpu_kernels.build("C++ gated RMSNorm", "mixerbench_norm_gate", SOURCE, ABI_VERSION,
                             "mixerbench_norm_gate_abi_version", entries)


def unavailable_reason() -> str | None:
    """None where the library is built, else why not (one line)."""
    return cpu_kernels.failure(_library())


def runs(*tensors: Tensor) -> bool:
    """Whether the compiled pass takes these tensors: all on the CPU in one of float32 and float64, and built."""
    return cpu_kernels.takes(tensors, _CTYPE, unavailable_reason)


def _rows(x: Tensor, z: Tensor, weight: Tensor) -> tuple:
    """Sizes, then x's and z's pointers and row strides; both (R, C) with their channels adjacent."""
    rows, channels = x.shape
    sizes = (rows, channels // weight.shape[0], weight.shape[0])
    return (*(ctypes.c_int64(v) for v in sizes), pointer(x), ctypes.c_int64(x.stride(0)), pointer(z),
            ctypes.c_int64(z.stride(0)), pointer(weight))


def forward(x: Tensor, weight: Tensor, z: Tensor, eps: float) -> Tensor:
    """y (R, C), contiguous; x and z (R, C) with their channels adjacent (`cpu_kernels.last_adjacent`), weight (S,)
    contiguous, all in one dtype."""
    y = x.new_empty(x.shape)
    getattr(cpu_kernels.loaded(_library()), f"mixerbench_norm_gate_fwd_{_CTYPE[x.dtype]}")(
        *_rows(x, z, weight), ctypes.c_double(eps), pointer(y), cpu_kernels.threads())
    return y


def backward(dy: Tensor, x: Tensor, weight: Tensor, z: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dz) given y's gradient dy (R, C) contiguous; the others as `forward` took them."""
    threads = cpu_kernels.threads()
    dx, dz = x.new_empty(x.shape), x.new_empty(x.shape)
    part = x.new_zeros(threads.value, weight.shape[0])  # the weight's gradient per thread, summed below
    getattr(cpu_kernels.loaded(_library()), f"mixerbench_norm_gate_bwd_{_CTYPE[x.dtype]}")(
        *_rows(x, z, weight), ctypes.c_double(eps), pointer(dy), pointer(dx), pointer(dz), pointer(part), threads)
    return dx, part.sum(0), dz
