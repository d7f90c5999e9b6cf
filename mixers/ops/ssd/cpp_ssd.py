"""The custom op `mixerbench::ssd_recurrent_cpp` (`cpp_loop`): SSD's recurrence step by step in the compiled loop of
`mixers/ops/gated_recurrence`, forward and backward, on the CPU.

`ssd_recurrent_cpp` takes `chunk_ssd`'s arguments and gives its result; `ssd_both_ways_cpp` takes them stacked
on a leading direction axis of 2 and runs direction 1 anti-causally (from the last step to the first), in one call
on unflipped tensors (mamba2's two directions). SSD is the gated recurrence with one decay per head (a gate of
width 1) and B and C shared by the heads (passed with a head stride of 0, never copied per head): keys b, queries
c, values x, scale 1. Where the chunked form runs tens of PyTorch ops per call, most of mamba2's time at the micro
preset, this runs one loop per (direction, sequence, head). `chunk_size` is not used by the loop: the counters
charge the chunked form's MACs (`chunk_ssd_macs`) at that chunk size, so the mixer's MACs are one number whichever
implementation runs.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from .. import cpu_kernels
from ..gated_recurrence import backward_into, forward_into
from ..precision import compute_dtype
from .chunk import chunk_ssd_macs


def ssd_recurrent_cpp(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int = 64) -> Tensor:
    """Causal SSD through the compiled loop; arguments and result as `chunk_ssd` (CPU tensors; float64 computed in
    float64, others in float32)."""
    if chunk_size < 1:
        raise ValueError(f"ssd_recurrent_cpp: chunk_size must be >= 1, got {chunk_size}")
    one_way = (t.unsqueeze(0) for t in (x, a, b, c))  # a direction axis of 1
    return torch.ops.mixerbench.ssd_recurrent_cpp(*one_way, chunk_size)[0].to(x.dtype)


def ssd_both_ways_cpp(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int = 64) -> Tensor:
    """Causal SSD on direction 0 and anti-causal SSD on direction 1: x (2, batch, L, H, P), a (2, batch, L, H), b and
    c (2, batch, L, N) -> y (2, batch, L, H, P), both in the sequence's order. Equal to `chunk_ssd` on direction 0
    and to `chunk_ssd` of the flipped direction 1, flipped back."""
    if chunk_size < 1:
        raise ValueError(f"ssd_both_ways_cpp: chunk_size must be >= 1, got {chunk_size}")
    return torch.ops.mixerbench.ssd_recurrent_cpp(x, a, b, c, chunk_size).to(x.dtype)


def _views(x: Tensor, a: Tensor, b: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v, g of the gated recurrence, (D, batch, H, L, *) views: c and b shared by the heads (stride 0), x's
    heads as they lie, a gate of width 1 per head."""
    heads = x.shape[3]
    shared = [m.unsqueeze(2).expand(-1, -1, heads, -1, -1) for m in (c, b)]  # (D, batch, H, L, N), no copy
    return shared[0], shared[1], x.transpose(2, 3), a.transpose(2, 3).unsqueeze(-1)


# The ops take x (D, batch, L, H, P), a (D, batch, L, H), b and c (D, batch, L, N): D = 1 is the causal SSD, D = 2 adds
# the anti-causal one as direction 1.
@torch.library.custom_op("mixerbench::ssd_recurrent_cpp", mutates_args=())
def _ssd(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int) -> Tensor:
    compute = compute_dtype(x)
    x, a, b, c = (cpu_kernels.last_adjacent(t.to(compute)) for t in (x, a, b, c))
    y = torch.empty_like(x, memory_format=torch.contiguous_format)  # (D, batch, L, H, P)
    forward_into(y.transpose(2, 3), *_views(x, a, b, c), 1.0)
    return y


@_ssd.register_fake
def _ssd_fake(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int) -> Tensor:
    return x.new_empty(x.shape, dtype=compute_dtype(x))


@torch.library.custom_op("mixerbench::ssd_recurrent_cpp_bwd", mutates_args=())
def _ssd_backward(dy: Tensor, x: Tensor, a: Tensor, b: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, da, db, dc) in the compute dtype, contiguous, shaped as x, a, b, c."""
    compute = compute_dtype(x)
    dy, x, a, b, c = (cpu_kernels.last_adjacent(t.to(compute)) for t in (dy, x, a, b, c))
    directions, batch, length, heads, _ = x.shape
    dx, da = x.new_empty(x.shape), a.new_empty(a.shape)
    dc_heads, db_heads = (x.new_empty(directions, batch, heads, length, m.shape[-1]) for m in (c, b))  # summed below
    backward_into(dc_heads, db_heads, dx.transpose(2, 3), da.transpose(2, 3).unsqueeze(-1), dy.transpose(2, 3),
                  *_views(x, a, b, c), 1.0)
    return dx, da, db_heads.sum(2), dc_heads.sum(2)


@_ssd_backward.register_fake
def _ssd_backward_fake(dy: Tensor, x: Tensor, a: Tensor, b: Tensor, c: Tensor
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return tuple(t.new_empty(t.shape, dtype=compute_dtype(x)) for t in (x, a, b, c))


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    x, a, b, c, _ = inputs
    ctx.save_for_backward(x, a, b, c)


def _backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:
    x, a, b, c = ctx.saved_tensors
    grads = torch.ops.mixerbench.ssd_recurrent_cpp_bwd(dy, x, a, b, c)
    return (*(d.to(t.dtype) for d, t in zip(grads, (x, a, b, c))), None)


_ssd.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.mixerbench.ssd_recurrent_cpp)
def _ssd_flops(x_shape: list[int], a_shape: list[int], b_shape: list[int], c_shape: list[int], chunk_size: int,
               **kwargs) -> int:
    directions, batch, length, heads, head_dim = x_shape
    return 2 * directions * batch * chunk_ssd_macs(length, heads, head_dim, b_shape[-1], chunk_size)
