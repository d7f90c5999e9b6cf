"""The custom op `mixerbench::selective_scan_cpp` (`cpp_loop`): the selective scan as a compiled C++ loop on the CPU.

The stepped PyTorch op (`torch_stream`) pays Python and dispatch per time step; this one runs the whole recurrence,
forward and backward, in `cpp_scan.cpp`: per (sequence, block of channels) a loop over time with the state in a
small buffer, exp(delta A) from a vectorised polynomial, and a backward that recomputes the block's states and
runs the reverse scan (mamba-ssm's design on a CPU). `reverse` is native (the loop runs backwards).

The source is plain C++ on raw pointers (no torch headers), built on first use by
`torch.utils.cpp_extension.load` into torch's extension cache (`TORCH_EXTENSIONS_DIR`, else
~/.cache/torch_extensions): about a second with g++, then reused until the source changes. Where it cannot be
built (no compiler) `cpp_unavailable_reason` says why and `auto` falls back to `torch_stream`. The library is
called through ctypes, which releases the GIL; its threads follow `torch.get_num_threads()`.

Softplus, the bias, the D skip and the z gate stay in PyTorch around the kernel (element-wise, already
vectorised); the kernel sees the effective delta and returns sum_n C_t h_t.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from .naive import compute_dtype, effective_delta, grouped

SOURCE = Path(__file__).with_name("cpp_scan.cpp")
# Bumped with the C entry points' signatures; the library reports it so a stale build is never called.
ABI_VERSION = 2
# Set to 0 to never build or load the library (`auto` then picks `torch_stream` on the CPU).
ENABLE_ENV = "MIXERBENCH_CPP_SCAN"
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_CTYPE = {torch.float32: "f32", torch.float64: "f64"}


def _vector_isa() -> tuple[str, list[str]]:
    """The vector instructions to build for: AVX2 with FMA where torch's own dispatch found AVX2 or AVX-512 on this
    CPU (8 floats a vector), else the compiler's baseline (SSE2 on x86-64, 4 floats; NEON on arm64). The name goes
    into the cached library's name, so a home folder shared by different CPUs never loads a build it cannot run."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX2", "AVX512"):
        return "avx2", ["-mavx2", "-mfma"]
    return "baseline", []


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The built library, or the reason it cannot be had (cached: a failed build is not retried per call)."""
    if os.environ.get(ENABLE_ENV, "1").strip() == "0":
        return f"disabled by {ENABLE_ENV}=0"
    # cpp_extension logs a CUDA_HOME warning on import on a CUDA build without a GPU; it concerns nvcc only.
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension

        isa, isa_flags = _vector_isa()
        path = cpp_extension.load(
            name=f"mixerbench_cpp_scan_v{ABI_VERSION}_{isa}",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-std=c++17", "-fopenmp-simd", "-fno-trapping-math", *isa_flags],
            is_python_module=False,
            verbose=False,
        )
        lib = ctypes.CDLL(str(path))
    except Exception as err:  # noqa: BLE001 - any build or load failure means: use the PyTorch scan
        return f"the C++ scan could not be built or loaded ({type(err).__name__}: {str(err).strip()[:300]})"
    finally:
        logger.setLevel(level)
    if lib.mixerbench_scan_abi_version() != ABI_VERSION:
        return f"the cached C++ scan library has ABI {lib.mixerbench_scan_abi_version()}, expected {ABI_VERSION}"
    for suffix in _CTYPE.values():
        getattr(lib, f"mixerbench_scan_fwd_{suffix}").restype = None
        getattr(lib, f"mixerbench_scan_bwd_{suffix}").restype = None
    return lib


def cpp_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None where `cpp_loop` runs on tensors of `device` and `dtype`, else why not (one line)."""
    if device.type != "cpu":
        return f"the C++ scan runs on CPU tensors, got {device}"
    if dtype not in SUPPORTED_DTYPES:
        return f"the C++ scan takes float tensors (float64, float32, or half types accumulated in float32), got {dtype}"
    lib = _library()
    return lib if isinstance(lib, str) else None


def _ptr(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if t is None else t.data_ptr())


class _Inputs:
    """The kernel's inputs, contiguous in the compute dtype: u, effective delta (B, D, L), A (D, N), B and C
    transposed to (B, G, L, N) so a time step reads N adjacent values."""

    def __init__(self, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, delta_bias: Tensor | None,
                 delta_softplus: bool) -> None:
        ct = compute_dtype(u)
        self.dtype = ct
        self.u = u.to(ct).contiguous()  # (B, D, L)
        self.delta = effective_delta(delta, delta_bias, delta_softplus, ct).contiguous()  # (B, D, L)
        self.A = A.to(ct).contiguous()  # (D, N)
        self.B = rearrange(grouped(B.to(ct)), "b g n l -> b g l n").contiguous()  # (B, G, L, N)
        self.C = rearrange(grouped(C.to(ct)), "b g n l -> b g l n").contiguous()  # (B, G, L, N)
        self.shape = (*u.shape, A.shape[1], self.B.shape[1])  # batch, channels, length, d_state, groups
        self.suffix = _CTYPE[ct]

    def args(self) -> tuple:
        sizes = tuple(ctypes.c_int64(s) for s in self.shape)
        return (*sizes, *(_ptr(t) for t in (self.u, self.delta, self.A, self.B, self.C)))


def _threads() -> ctypes.c_int:
    return ctypes.c_int(max(1, torch.get_num_threads()))


def _lib() -> ctypes.CDLL:
    lib = _library()
    if isinstance(lib, str):
        raise RuntimeError(lib)
    return lib


def _scan_core(p: _Inputs, reverse: bool) -> Tensor:
    """sum_n C_t[n] h_t[n], (B, D, L) in the compute dtype."""
    y = torch.empty_like(p.u)  # (B, D, L)
    getattr(_lib(), f"mixerbench_scan_fwd_{p.suffix}")(*p.args(), _ptr(y), ctypes.c_int(int(reverse)), _threads())
    return y


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
        y (B, D, L) in `u.dtype`, contiguous.
    """
    with torch.no_grad():
        p = _Inputs(u, delta, A, B, C, delta_bias, delta_softplus)
        y = _scan_core(p, reverse)
        if D is not None:
            y = y + D.to(p.dtype)[:, None] * p.u
        if z is not None:
            y = y * F.silu(z.to(p.dtype))
        return y.to(u.dtype).contiguous()


@torch.library.custom_op("mixerbench::selective_scan_cpp_bwd", mutates_args=())
def _scan_core_backward(
    dy_core: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The kernel's backward as an op of its own (so autograd tracing, e.g. opcheck or torch.compile, sees an
    opaque op with a fake, not a data pointer): gradients of y_core = sum_n C h with respect to u, the effective
    delta, A, B, C, and y_core itself (the z gate's gradient needs it). Inputs in the compute dtype; delta is the
    effective delta.

    Returns:
        (du, d_delta, dA, dB, dC, y_core), shaped as u, delta, A, B, C, u.
    """
    p = _Inputs(u, delta, A, B, C, None, False)
    batch, channels, length, d_state, groups = p.shape
    threads = _threads()
    dy_core = dy_core.to(p.dtype).contiguous()  # (B, D, L)
    du = torch.empty_like(p.u)  # (B, D, L)
    d_delta = torch.empty_like(p.u)  # (B, D, L)
    dA_part = p.u.new_zeros(threads.value, channels, d_state)  # per thread, (T, D, N)
    dB_part = p.u.new_zeros(threads.value, batch, groups, length, d_state)  # per thread, (T, B, G, L, N)
    dC_part = p.u.new_zeros(threads.value, batch, groups, length, d_state)  # per thread, (T, B, G, L, N)
    y_core = torch.empty_like(p.u)  # (B, D, L)
    getattr(_lib(), f"mixerbench_scan_bwd_{p.suffix}")(
        *p.args(), _ptr(dy_core), _ptr(du), _ptr(d_delta), _ptr(dA_part), _ptr(dB_part),
        _ptr(dC_part), _ptr(y_core), ctypes.c_int(int(reverse)), threads,
    )
    dB = rearrange(dB_part.sum(0), "b g l n -> b g n l").reshape(B.shape).contiguous()  # as B
    dC = rearrange(dC_part.sum(0), "b g l n -> b g n l").reshape(C.shape).contiguous()  # as C
    return du, d_delta, dA_part.sum(0), dB, dC, y_core


@_scan_core_backward.register_fake
def _scan_core_backward_fake(
    dy_core: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, reverse: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    ct = compute_dtype(u)
    return tuple(t.new_empty(t.shape, dtype=ct) for t in (u, u, A, B, C, u))


def _cpp_backward(dy: Tensor, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
                  z: Tensor | None, delta_bias: Tensor | None, delta_softplus: bool,
                  reverse: bool) -> tuple[Tensor | None, ...]:
    """Gradients (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias), None where the input was None.

    The gate, the skip and softplus are differentiated here in PyTorch; the kernel's op gives the scan's part.
    """
    ct = compute_dtype(u)
    dy = dy.to(ct)
    if z is not None:
        zc = z.to(ct)
        sig = torch.sigmoid(zc)
        dy_core = dy * zc * sig  # d loss / d (y_core + D u), (B, D, L)
    else:
        dy_core = dy
    uc = u.to(ct)
    delta_eff = effective_delta(delta, delta_bias, delta_softplus, ct)
    du, d_delta, dA, dB, dC, y_core = torch.ops.mixerbench.selective_scan_cpp_bwd(
        dy_core, uc, delta_eff, A.to(ct), B.to(ct), C.to(ct), reverse
    )
    dz = None
    if z is not None:
        pre_gate = y_core if D is None else y_core + D.to(ct)[:, None] * uc
        dz = (dy * pre_gate * sig * (1 + zc * (1 - sig))).to(z.dtype)
    dD = None if D is None else (dy_core * uc).sum((0, 2)).to(D.dtype)
    if D is not None:
        du = du + dy_core * D.to(ct)[:, None]
    if delta_softplus:
        pre = delta.to(ct) if delta_bias is None else delta.to(ct) + delta_bias.to(ct)[:, None]
        d_delta = d_delta * torch.sigmoid(pre)
    d_bias = None if delta_bias is None else d_delta.sum((0, 2)).to(delta_bias.dtype)
    return (du.to(u.dtype), d_delta.to(delta.dtype), dA.to(A.dtype), dB.to(B.dtype), dC.to(C.dtype), dD, dz, d_bias)


@torch.library.custom_op("mixerbench::selective_scan_cpp", mutates_args=())
def _selective_scan_cpp_op(
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
    return u.new_empty(u.shape)


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


_selective_scan_cpp_op.register_autograd(_backward, setup_context=_setup_context)
