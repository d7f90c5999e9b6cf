"""The selective scan of Mamba (S6): one dispatch over its implementations, the reference beside the fast paths.

    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t        (per channel d, per state n)
    y_t = (sum_n C_t[n] * h_t[n] + D * u_t) * silu(z_t)

Shapes follow mamba-ssm's `selective_scan_fn`: `u, delta, z: (B, D, L)`, `A: (D, N)` real, `B, C: (B, N, L)`,
`D, delta_bias: (D,)`. Inputs in fp16/bf16 are accumulated in float32 and the result is cast back to `u.dtype`.

The implementations, each with `reverse` (scan from the last step to the first, y in the original order: the
backward direction of Vision Mamba):
- `naive.py`: `selective_scan_reference`, a float64 loop written for clarity (the tests' independent reference),
  and `selective_scan_loop` (`torch_loop`), a loop over `unbind` slices that autograd differentiates; it keeps
  every state, so memory is O(B D L N).
- `stream.py`: the custom op `mixerbench::selective_scan` (`torch_stream`), chunk by chunk of time steps from
  Python, with a hand-written backward that recomputes states per chunk.
- `cpp_scan.py` / `cpp_scan.cpp`: the custom op `mixerbench::selective_scan_cpp` (`cpp_loop`), the recurrence as a
  compiled C++ loop on the CPU, forward and backward, built on first use where a compiler exists; `auto` picks it
  on the CPU and falls back to `torch_stream` where it cannot be built. `reverse` is native, and so is an `order`
  per channel group (each group scans its own permutation of the sequence in place: vmamba's cross-scan).
- mamba-ssm's `selective_scan_fn` (`mamba_ssm_cuda`), when it imports and the tensors are on CUDA.
- `triton_scan.py`: Triton kernels on mamba-ssm's CUDA design (`triton`, the custom op
  `mixerbench::selective_scan_triton`): coalesced tiles along L, a parallel scan per state within a chunk, the
  state carried across chunks in registers, a reverse scan in the backward; `reverse` is native. It runs on CUDA
  tensors where triton imports, and on CPU tensors only under Triton's interpreter (`TRITON_INTERPRET=1`), which
  the tests use.
Every implementation without a native reverse gets it by flipping its (B, *, L) inputs and its output along L.
"""
from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ...base import CUSTOM_OP_MACS
from . import cpp_scan, triton_scan
from .cpp_scan import selective_scan_cpp, selective_scan_cpp_call
from .naive import selective_scan_loop, selective_scan_reference
from .stream import selective_scan_stream

__all__ = [
    "NATIVE_REVERSE_IMPLS",
    "mamba_ssm_unavailable_reason",
    "SCAN_IMPLS",
    "ScanImpl",
    "resolve_scan_impl",
    "selective_scan",
    "selective_scan_cpp",
    "selective_scan_cpp_call",
    "selective_scan_flops",
    "selective_scan_loop",
    "selective_scan_reference",
    "selective_scan_stream",
]

ScanImpl = Literal["auto", "mamba_ssm_cuda", "triton", "cpp_loop", "torch_stream", "torch_loop"]
SCAN_IMPLS: tuple[str, ...] = ("auto", "mamba_ssm_cuda", "triton", "cpp_loop", "torch_stream", "torch_loop")
# Implementations whose kernels read the sequence backwards themselves; the others are flipped around.
NATIVE_REVERSE_IMPLS: frozenset[str] = frozenset({"triton", "cpp_loop"})


def selective_scan_flops(batch: int, d_inner: int, length: int, d_state: int) -> int:
    """FLOPs of one selective scan: 9 x B x L x D x N, the Mamba authors' figure.

    This one function defines the count for the analytic MACs, the `FlopCounterMode` formula and fvcore
    handles. Element-wise work (the D skip, the z gate, softplus) is not counted, by the project's convention.
    MACs are half of it.

    Args:
        batch: sequences B.
        d_inner: scanned channels D (expand x dim in Mamba).
        length: time steps L.
        d_state: state size N per channel.
    """
    return 9 * batch * length * d_inner * d_state




@register_flop_formula([torch.ops.mixerbench.selective_scan, torch.ops.mixerbench.selective_scan_triton,
                        torch.ops.mixerbench.selective_scan_cpp])
def _selective_scan_flop_formula(
    u_shape: list[int], delta_shape: list[int], A_shape: list[int], *args, **kwargs
) -> int:
    batch, length, d_inner = u_shape[0], u_shape[-1], math.prod(u_shape[1:-1])  # u (B, D, L) or (B, G, D / G, L)
    return selective_scan_flops(batch, d_inner, length, A_shape[1])


def _selective_scan_macs_from_shapes(shapes: list[tuple[int, ...] | None]) -> int:
    """MACs of a selective-scan op (`mixerbench::selective_scan` and the others taking the same inputs) from the
    shapes of its inputs (u first, A third), for fvcore."""
    u_shape, A_shape = shapes[0], shapes[2]
    if u_shape is None or A_shape is None:
        raise ValueError("selective scan op: the counter gave no shapes for u and A")
    batch, length, d_inner = u_shape[0], u_shape[-1], math.prod(u_shape[1:-1])  # u (B, D, L) or (B, G, D / G, L)
    return selective_scan_flops(batch, d_inner, length, A_shape[1]) // 2


CUSTOM_OP_MACS["mixerbench::selective_scan"] = _selective_scan_macs_from_shapes
CUSTOM_OP_MACS["mixerbench::selective_scan_triton"] = _selective_scan_macs_from_shapes
CUSTOM_OP_MACS["mixerbench::selective_scan_cpp"] = _selective_scan_macs_from_shapes
# mamba-ssm's kernel is an autograd Function taking the same (u, delta, A, ...) inputs; a jit trace names it
# prim::PythonOp.SelectiveScanFn, so fvcore counts it by the same formula on CUDA (not checked on a GPU yet).
CUSTOM_OP_MACS["prim::PythonOp.SelectiveScanFn"] = _selective_scan_macs_from_shapes


@functools.cache
def _mamba_ssm_import() -> tuple[Callable[..., Tensor] | None, str | None]:
    """mamba-ssm's CUDA `selective_scan_fn` and None, or None and why it does not import.

    Any exception counts as "does not import", not only ImportError: a release whose API drifted (an
    AttributeError or a TypeError at import) must leave the other implementations running, not fail every mamba
    point. Cached: a failed import is retried (and the file system searched) on every call otherwise.
    """
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except ImportError as err:
        return None, f"mamba-ssm does not import ({err})"
    except Exception as err:  # noqa: BLE001 - see the docstring
        return None, f"mamba-ssm failed to import with {type(err).__name__}: {err}"
    return selective_scan_fn, None


def _mamba_ssm_selective_scan_fn() -> Callable[..., Tensor] | None:
    """mamba-ssm's CUDA `selective_scan_fn`, or None where it does not import."""
    return _mamba_ssm_import()[0]


def mamba_ssm_unavailable_reason() -> str | None:
    """Why mamba-ssm's kernel does not import here (one line), or None where it does."""
    return _mamba_ssm_import()[1]


@functools.cache
def _warn_mamba_ssm_broken(reason: str) -> None:
    """Says once per process that `auto` passed over an installed but broken mamba-ssm (an ImportError, the
    usual case of mamba-ssm simply not being installed, stays silent)."""
    warnings.warn(f"selective scan: {reason}; using the next implementation", RuntimeWarning, stacklevel=3)


# Compiled, the choice is made once while tracing and kept as a constant: Dynamo would otherwise trace into the
# cached import and build checks below (warning that it ignores their caches) on every graph.
@torch.compiler.assume_constant_result
def resolve_scan_impl(impl: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The implementation `selective_scan` runs for `impl` on tensors of `device` and `dtype`.

    `auto` picks, for fp32/fp16/bf16 CUDA tensors, `mamba_ssm_cuda` when mamba-ssm imports, else `triton` when
    triton imports; on the CPU `cpp_loop` where the C++ scan builds, else `torch_stream`. A mamba-ssm that is
    installed but fails to import with anything but ImportError is passed over with a RuntimeWarning that gives
    the reason (`mamba_ssm_unavailable_reason`).
    Raises if `mamba_ssm_cuda`, `triton` or `cpp_loop` is asked for where it cannot run (the Triton kernels run on
    CPU tensors only under `TRITON_INTERPRET=1`). On the meta device (shapes only, for counting) `triton`,
    `torch_stream` and `torch_loop` stand, and `auto`, `mamba_ssm_cuda` and `cpp_loop` give `torch_stream`: its
    op has a fake, the same forward flop formula, and a meta backward that counts what a real one does.
    """
    if impl not in SCAN_IMPLS:
        raise ValueError(f"unknown scan impl {impl!r}; choose one of {', '.join(SCAN_IMPLS)}")
    if device.type == "meta":
        # Shape only (counting builds the model on meta): nothing runs, so nothing needs CUDA, triton or a
        # compiler. The Triton impl keeps its op (it has a fake and the flop formula); mamba-ssm's kernel and the
        # C++ loop have no meta backward, so they (and `auto`) count through `torch_stream`'s op, same formula.
        return impl if impl in ("triton", "torch_stream", "torch_loop") else "torch_stream"
    cuda_dtype = device.type == "cuda" and dtype in (torch.float32, torch.float16, torch.bfloat16)
    kernel_runs = cuda_dtype and _mamba_ssm_selective_scan_fn() is not None
    triton_problem = triton_scan.triton_unavailable_reason(device, dtype)
    if impl == "auto":
        if kernel_runs:
            return "mamba_ssm_cuda"
        broken = mamba_ssm_unavailable_reason()
        if cuda_dtype and broken is not None and not broken.startswith("mamba-ssm does not import"):
            _warn_mamba_ssm_broken(broken)
        if device.type == "cuda" and triton_problem is None:
            return "triton"
        return "cpp_loop" if cpp_scan.cpp_unavailable_reason(device, dtype) is None else "torch_stream"
    if impl == "triton" and triton_problem is not None:
        raise RuntimeError(f"scan impl {impl!r} cannot run on {dtype} tensors on {device}: {triton_problem}")
    if impl == "cpp_loop" and (cpp_problem := cpp_scan.cpp_unavailable_reason(device, dtype)) is not None:
        raise RuntimeError(f"scan impl 'cpp_loop' cannot run on {dtype} tensors on {device}: {cpp_problem}")
    if impl == "mamba_ssm_cuda" and not kernel_runs:
        raise RuntimeError(
            f"scan impl 'mamba_ssm_cuda' needs fp32/fp16/bf16 CUDA tensors (got {dtype} on {device}) and an "
            f"importable mamba-ssm ({mamba_ssm_unavailable_reason() or 'found'}); "
            "install the 'mamba' extra on a CUDA machine or use impl='auto'"
        )
    return impl


def _flip_time(t: Tensor | None) -> Tensor | None:
    """t reversed along its last (time) axis, or None."""
    return None if t is None else t.flip(-1)


def selective_scan(
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
    impl: str = "auto",
    reverse: bool = False,
) -> tuple[Tensor, str]:
    """The selective scan through the chosen implementation; differentiable in every case.

    The (B, *, L) inputs may have any strides: `cpp_loop` reads them as they are (Mamba hands it time-major views)
    and lays y out as delta; the GPU kernels get u, delta, B and C contiguous along L; the others copy as they need.

    Args:
        u, delta, A, B, C, D, z, delta_bias, delta_softplus: as `selective_scan_reference`; B and C may carry G
            channel groups, (B, G, N, L): `cpp_loop` takes them in one pass, the others run once per group.
        impl: `auto` (on CUDA mamba-ssm's kernel when it imports, else `triton`; on the CPU `cpp_loop` where
            it builds, else `torch_stream`), `mamba_ssm_cuda`, `triton` (the Triton kernels, op
            `mixerbench::selective_scan_triton`), `cpp_loop` (the compiled CPU loop, op
            `mixerbench::selective_scan_cpp`),
            `torch_stream` (the custom op `mixerbench::selective_scan`) or `torch_loop` (autograd through the loop).
        reverse: scan from the last step to the first, y in the original order: equal to flipping u, delta, B,
            C, z along L, scanning, and flipping y back, which is what implementations without a native reverse
            (all but `triton` and `cpp_loop`, see `NATIVE_REVERSE_IMPLS`) do.

    Returns:
        y (B, D, L) in `u.dtype`, and the name of the implementation that ran.
    """
    name = resolve_scan_impl(impl, u.device, u.dtype)
    if B.dim() == 4:
        groups = B.shape[1]
        if C.shape != B.shape or u.shape[1] % groups:
            raise ValueError(f"selective scan: grouped B {tuple(B.shape)} and C {tuple(C.shape)} must match, and "
                             f"their G = {groups} groups must divide the {u.shape[1]} channels")
        if name != "cpp_loop" and groups > 1:
            return _scan_by_group(name, u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse), name
        if name != "cpp_loop":
            B, C = B[:, 0], C[:, 0]  # (B, N, L): one group
    return _scan(name, u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse), name


def _scan_by_group(name: str, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None,
                   z: Tensor | None, delta_bias: Tensor | None, delta_softplus: bool, reverse: bool) -> Tensor:
    """Grouped B, C (B, G, N, L) through an implementation that takes one group: one call per group's channels."""
    groups = B.shape[1]
    width = u.shape[1] // groups

    def part(t: Tensor | None, g: int, dim: int) -> Tensor | None:
        return None if t is None else t.narrow(dim, g * width, width)

    ys = [_scan(name, part(u, g, 1), part(delta, g, 1), part(A, g, 0), B[:, g], C[:, g], part(D, g, 0),
                part(z, g, 1), part(delta_bias, g, 0), delta_softplus, reverse) for g in range(groups)]
    return torch.cat(ys, dim=1)  # (B, D, L)


def _rows_along_time(*ts: Tensor) -> tuple[Tensor, ...]:
    """Each (B, *, L) tensor with L contiguous: as it is where it already is, else copied (once, here)."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in ts)


def _scan(name: str, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, z: Tensor | None,
          delta_bias: Tensor | None, delta_softplus: bool, reverse: bool) -> Tensor:
    """y of the implementation `name` (already resolved) with B, C as that implementation takes them."""
    if name in ("triton", "mamba_ssm_cuda"):
        # Their tiles read each (channel, state) row along L coalesced; the CPU loop reads any layout.
        u, delta, B, C = _rows_along_time(u, delta, B, C)
    if name == "triton":
        y, _ = torch.ops.mixerbench.selective_scan_triton(
            u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse
        )
        return y
    if name == "cpp_loop":
        return selective_scan_cpp_call(u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse)
    if reverse:
        u, delta, B, C, z = (_flip_time(t) for t in (u, delta, B, C, z))
    if name == "mamba_ssm_cuda":
        scan_fn = _mamba_ssm_selective_scan_fn()
        y = scan_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    elif name == "torch_loop":
        y = selective_scan_loop(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    else:
        y = torch.ops.mixerbench.selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    return y.flip(-1) if reverse else y
