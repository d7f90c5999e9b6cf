"""The custom op `mixerbench::gla_recurrent_cpp` (`cpp_loop`): GLA's recurrence step by step in the compiled loop of
`mixers/ops/gated_recurrence`, forward and backward, on the CPU.

`gla_recurrent_cpp` takes `chunk_gla`'s arguments and gives its result: where the chunked form runs tens of PyTorch
ops per call (each a dispatch and a pass over memory, most of the mixer's time at the micro preset), this runs one
loop per (sequence, head) with the K x V state in a small buffer. `gla_both_ways_cpp` runs the causal pass and the
anti-causal one (a bidirectional mixer's two directions, each with its own gates) in one call on the unflipped
tensors and sums them. `chunk_size` is not used by the loop: the counters charge the chunked form's MACs
(`chunk_gla_macs`) at that chunk size, so a mixer's MACs are one number whichever implementation runs, as the meta
device's count and fla's GPU kernels see them.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from .. import cpu_kernels
from ..eager_op import EagerOp
from ..gated_recurrence import backward_into, forward_into
from ..precision import compute_dtype
from .chunk import chunk_gla_macs


def gla_recurrent_cpp(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float | None = None, chunk_size: int = 16
                      ) -> Tensor:
    """Causal gated linear attention through the compiled loop; arguments and result as `chunk_gla` (CPU tensors;
    float64 computed in float64, others in float32)."""
    if chunk_size < 1:
        raise ValueError(f"gla_recurrent_cpp: chunk_size must be >= 1, got {chunk_size}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    one_way = (t.unsqueeze(0) for t in (q, k, v, g))  # (1, B, H, L, *): one direction
    return _gla_call(*one_way, float(scale), chunk_size)[0].to(q.dtype)


def gla_both_ways_cpp(q: Tensor, k: Tensor, v: Tensor, g_forward: Tensor, g_backward: Tensor,
                      scale: float | None = None, chunk_size: int = 16) -> Tensor:
    """The causal GLA with gates `g_forward` plus the anti-causal one (the sequence read from its last step to its
    first) with gates `g_backward`, (B, H, L, V); arguments otherwise as `gla_recurrent_cpp`. Equal to
    `chunk_gla(q, k, v, g_forward) + chunk_gla(*flipped(q, k, v, g_backward)).flip(2)`, with nothing flipped."""
    if chunk_size < 1:
        raise ValueError(f"gla_both_ways_cpp: chunk_size must be >= 1, got {chunk_size}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    shared = (t.unsqueeze(0).expand(2, *t.shape) for t in (q, k, v))  # one tensor read by both directions
    out = _gla_call(*shared, torch.stack([g_forward, g_backward]), float(scale), chunk_size)
    return out.sum(0).to(q.dtype)  # its backward hands both directions one gradient (stride 0), no copies


# The ops take (D, B, H, L, *) tensors: D = 1 is the causal GLA, D = 2 adds the anti-causal one as direction 1.
def _gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float, chunk_size: int) -> Tensor:
    compute = compute_dtype(q)
    q, k, v, g = (cpu_kernels.last_adjacent(t.to(compute)) for t in (q, k, v, g))
    out = q.new_empty(*q.shape[:4], v.shape[-1])  # (D, B, H, L, V)
    forward_into(out, q, k, v, g, scale)
    return out


_gla_op = torch.library.custom_op("mixerbench::gla_recurrent_cpp", _gla, mutates_args=())


@_gla_op.register_fake
def _gla_fake(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float, chunk_size: int) -> Tensor:
    return q.new_empty(*q.shape[:4], v.shape[-1], dtype=compute_dtype(q))


def _gla_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dg) in the compute dtype, contiguous, shaped as q, k, v, g (an input shared by the directions,
    stride 0, gets a gradient per direction: autograd's expand sums them)."""
    compute = compute_dtype(q)
    dout, q, k, v, g = (cpu_kernels.last_adjacent(t.to(compute)) for t in (dout, q, k, v, g))
    grads = tuple(t.new_empty(t.shape) for t in (q, k, v, g))
    backward_into(*grads, dout, q, k, v, g, scale)
    return grads


_gla_backward_op = torch.library.custom_op("mixerbench::gla_recurrent_cpp_bwd", _gla_backward, mutates_args=())
_gla_backward_call = EagerOp(_gla_backward_op, _gla_backward)


@_gla_backward_op.register_fake
def _gla_backward_fake(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return tuple(t.new_empty(t.shape, dtype=compute_dtype(q)) for t in (q, k, v, g))


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    q, k, v, g, scale, _ = inputs
    ctx.save_for_backward(q, k, v, g)
    ctx.scale = scale


def _backward(ctx, dout: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, g = ctx.saved_tensors
    grads = _gla_backward_call(dout, q, k, v, g, ctx.scale)
    return (*(d.to(t.dtype) for d, t in zip(grads, (q, k, v, g))), None, None)


# The op, or in plain eager on the CPU the same functions without the dispatcher; EagerOp registers the op's
# autograd (mixers/ops/eager_op.py).
_gla_call = EagerOp(_gla_op, _gla, _setup_context, _backward)


@register_flop_formula(torch.ops.mixerbench.gla_recurrent_cpp)
def _gla_flops(q_shape: list[int], k_shape: list[int], v_shape: list[int], g_shape: list[int], scale: float,
               chunk_size: int, **kwargs) -> int:
    directions, batch, heads, length, key_dim = q_shape
    return 2 * directions * batch * chunk_gla_macs(heads, length, key_dim, v_shape[-1], chunk_size)
