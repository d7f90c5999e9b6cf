"""The custom ops `mixerbench::ssd_recurrent_cpp` and `mixerbench::ssd_hydra_cpp` (`cpp_loop`): SSD's recurrence step
by step in the compiled loop of `mixers/ops/gated_recurrence`, forward and backward, on the CPU.

`ssd_recurrent_cpp` takes `chunk_ssd`'s arguments and gives its result. `ssd_hydra_cpp` (mamba2's two directions)
takes u, read by both directions, and the other inputs stacked on a leading direction axis of 2 with each
direction's step sizes dt; it runs direction 1 anti-causally (from the last step to the first) in the same call on
unflipped tensors, forms x = u dt in the loop (the recurrence's value scale), and returns Hydra's two off-diagonal
parts summed: direction 0's output one token later plus direction 1's one token earlier. The shifts are in the
buffers the loop writes and reads (`_shifted`): in PyTorch, added in place into slices, their backward copied and
zero-filled slices a dozen times. SSD is the gated recurrence with one decay per head (a gate of width 1) and B and
C shared by the heads (passed with a head stride of 0, never copied per head): keys b, queries c, values x, scale
one. Where the chunked form runs tens of PyTorch ops per call, most of mamba2's time at the micro preset, this runs
one loop per (direction, sequence, head). `chunk_size` is not used by the loop: the counters charge the chunked
form's MACs (`chunk_ssd_macs`) at that chunk size, so the mixer's MACs are one number whichever implementation
runs.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from .. import cpu_kernels
from ..eager_op import EagerOp
from ..gated_recurrence import backward_into, forward_into
from ..precision import compute_dtype
from .chunk import chunk_ssd_macs


def ssd_recurrent_cpp(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int = 64) -> Tensor:
    """Causal SSD through the compiled loop; arguments and result as `chunk_ssd` (CPU tensors; float64 computed in
    float64, others in float32)."""
    if chunk_size < 1:
        raise ValueError(f"ssd_recurrent_cpp: chunk_size must be >= 1, got {chunk_size}")
    one_way = (t.unsqueeze(0) for t in (x, a, b, c))  # a direction axis of 1
    return _ssd_call(*one_way, chunk_size)[0].to(x.dtype)


def ssd_hydra_cpp(u: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int = 64) -> Tensor:
    """Hydra's strictly lower and strictly upper parts applied, in one call: u (batch, L, H, P) read by both
    directions, each with its own step sizes dt (2, batch, L, H), decays a (2, batch, L, H), b and c (2, batch, L,
    N) -> (batch, L, H, P): at token t the causal SSD of direction 0 at t - 1 plus the anti-causal SSD of direction
    1 at t + 1 (zero beyond the ends), each with x = u dt. Equal to `chunk_ssd(u * dt[d, ..., None], a[d], b[d],
    c[d])` for direction 0 and the same of the flipped direction 1 flipped back, so shifted and summed; u dt is
    formed inside the loop, never as a tensor."""
    if chunk_size < 1:
        raise ValueError(f"ssd_hydra_cpp: chunk_size must be >= 1, got {chunk_size}")
    return _hydra_call(u, dt, a, b, c, chunk_size).to(u.dtype)


def _shifted(buffer: Tensor) -> Tensor:
    """The (2, batch, L, ...) view of a (2, batch, L + 1, ...) buffer whose direction 0 starts one step in: step t of
    direction 0 is the buffer's t + 1, of direction 1 its t. Hydra's shifts as strides: direction 0's output at t
    lands where token t + 1 reads it, and its output gradient at t is read from token t + 1's (likewise direction 1
    one token earlier), with the buffer's one extra step the zero beyond each end."""
    step = buffer.stride(2)
    shape = (2, buffer.shape[1], buffer.shape[2] - 1, *buffer.shape[3:])
    return buffer.as_strided(shape, (buffer.stride(0) - step, *buffer.stride()[1:]), buffer.storage_offset() + step)


def _views(x: Tensor, a: Tensor, b: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v, g of the gated recurrence, (D, batch, H, L, *) views: c and b shared by the heads (stride 0), x's
    heads as they lie, a gate of width 1 per head."""
    heads = x.shape[3]
    shared = [m.unsqueeze(2).expand(-1, -1, heads, -1, -1) for m in (c, b)]  # (D, batch, H, L, N), no copy
    return shared[0], shared[1], x.transpose(2, 3), a.transpose(2, 3).unsqueeze(-1)


# The ops take x (D, batch, L, H, P), a (D, batch, L, H), b and c (D, batch, L, N): D = 1 is the causal SSD, D = 2 adds
# the anti-causal one as direction 1. ssd_hydra_cpp: D = 2, and u (batch, L, H, P) with dt (2, batch, L, H) for x.
def _scale_view(dt: Tensor) -> Tensor:
    """dt (D, batch, L, H) as the loop's value scale, (D, batch, H, L, 1)."""
    return dt.transpose(2, 3).unsqueeze(-1)


def _forward_into(y: Tensor, x: Tensor, a: Tensor, b: Tensor, c: Tensor, dt: Tensor | None = None) -> None:
    """Writes each direction's outputs into y, a (D, batch, L, H, P) view with its last dimension adjacent; with
    dt, the values are x dt."""
    forward_into(y.transpose(2, 3), *_views(x, a, b, c), 1.0, None if dt is None else _scale_view(dt))


def _gradients(dy: Tensor, x: Tensor, a: Tensor, b: Tensor, c: Tensor, dt: Tensor | None = None) -> tuple[Tensor, ...]:
    """(dx, da, db, dc), and ddt where dt scales the values, given each direction's output gradient dy (D, batch,
    L, H, P); all in the compute dtype with their last dimension adjacent, dx per direction."""
    directions, batch, length, heads, _ = x.shape
    dx, da = x.new_empty(directions, *x.shape[1:]), a.new_empty(a.shape)
    dc_heads, db_heads = (x.new_empty(directions, batch, heads, length, m.shape[-1]) for m in (c, b))  # summed below
    ddt = None if dt is None else dt.new_empty(dt.shape)
    backward_into(dc_heads, db_heads, dx.transpose(2, 3), da.transpose(2, 3).unsqueeze(-1), dy.transpose(2, 3),
                  *_views(x, a, b, c), 1.0, *(() if dt is None else (_scale_view(dt), _scale_view(ddt))))
    grads = (dx, da, db_heads.sum(2), dc_heads.sum(2))
    return grads if dt is None else (*grads, ddt)


def _in_compute(*tensors: Tensor) -> tuple[Tensor, ...]:
    compute = compute_dtype(tensors[0])
    return tuple(cpu_kernels.last_adjacent(t.to(compute)) for t in tensors)


def _ssd(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int) -> Tensor:
    x, a, b, c = _in_compute(x, a, b, c)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)  # (D, batch, L, H, P)
    _forward_into(y, x, a, b, c)
    return y


_ssd_op = torch.library.custom_op("mixerbench::ssd_recurrent_cpp", _ssd, mutates_args=())


@_ssd_op.register_fake
def _ssd_fake(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int) -> Tensor:
    return x.new_empty(x.shape, dtype=compute_dtype(x))


def _ssd_backward(dy: Tensor, x: Tensor, a: Tensor, b: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, da, db, dc) in the compute dtype, contiguous, shaped as x, a, b, c."""
    return _gradients(*_in_compute(dy, x, a, b, c))


_ssd_backward_op = torch.library.custom_op("mixerbench::ssd_recurrent_cpp_bwd", _ssd_backward, mutates_args=())


@_ssd_backward_op.register_fake
def _ssd_backward_fake(dy: Tensor, x: Tensor, a: Tensor, b: Tensor, c: Tensor
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return tuple(t.new_empty(t.shape, dtype=compute_dtype(x)) for t in (x, a, b, c))


def _both_ways(u: Tensor) -> Tensor:
    """u (batch, L, H, P) as both directions' values, (2, batch, L, H, P) at a direction stride of 0."""
    return u.unsqueeze(0).expand(2, *u.shape)


def _hydra(u: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int) -> Tensor:
    u, dt, a, b, c = _in_compute(u, dt, a, b, c)
    batch, length, heads, head_dim = u.shape
    buffer = u.new_empty(2, batch, length + 1, heads, head_dim)
    buffer[0, :, 0] = 0  # token 0 has nothing before it
    buffer[1, :, length] = 0  # the last token nothing after it
    _forward_into(_shifted(buffer), _both_ways(u), a, b, c, dt)
    return buffer[0, :, :length] + buffer[1, :, 1:]


_hydra_op = torch.library.custom_op("mixerbench::ssd_hydra_cpp", _hydra, mutates_args=())


@_hydra_op.register_fake
def _hydra_fake(u: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int) -> Tensor:
    return u.new_empty(u.shape, dtype=compute_dtype(u))


def _hydra_backward(dy: Tensor, u: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(du, ddt, da, db, dc) given the output's gradient dy (batch, L, H, P): each direction reads it one token
    on; u's gradient summed over the directions."""
    u, dt, a, b, c = _in_compute(u, dt, a, b, c)
    batch, length, heads, head_dim = u.shape
    buffer = u.new_empty(2, batch, length + 1, heads, head_dim)
    buffer[0, :, :length] = dy  # direction 0's step t read at t + 1
    buffer[0, :, length] = 0
    buffer[1, :, 1:] = dy  # direction 1's step t read at t
    buffer[1, :, 0] = 0
    dx, da, db, dc, ddt = _gradients(_shifted(buffer), _both_ways(u), a, b, c, dt)
    return dx.sum(0), ddt, da, db, dc


_hydra_backward_op = torch.library.custom_op("mixerbench::ssd_hydra_cpp_bwd", _hydra_backward, mutates_args=())


@_hydra_backward_op.register_fake
def _hydra_backward_fake(dy: Tensor, u: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(t.new_empty(t.shape, dtype=compute_dtype(u)) for t in (u, dt, a, b, c))


def _ssd_setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    ctx.save_for_backward(*inputs[:-1])  # the tensors; chunk_size is not differentiated


def _autograd(backward_op):
    """The op's backward through `backward_op`, each gradient in its input's dtype (none for chunk_size)."""
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:
        grads = backward_op(dy, *ctx.saved_tensors)
        return (*(d.to(t.dtype) for d, t in zip(grads, ctx.saved_tensors)), None)
    return backward


_ssd_backward_call = _autograd(EagerOp(_ssd_backward_op, _ssd_backward))
_hydra_backward_call = _autograd(EagerOp(_hydra_backward_op, _hydra_backward))
# The ops, or in plain eager on the CPU the same functions without the dispatcher; EagerOp registers the ops'
# autograd (mixers/ops/eager_op.py).
_ssd_call = EagerOp(_ssd_op, _ssd, _ssd_setup_context, _ssd_backward_call)
_hydra_call = EagerOp(_hydra_op, _hydra, _ssd_setup_context, _hydra_backward_call)


@register_flop_formula(torch.ops.mixerbench.ssd_recurrent_cpp)
def _ssd_flops(x_shape: list[int], a_shape: list[int], b_shape: list[int], c_shape: list[int], chunk_size: int,
               **kwargs) -> int:
    directions, batch, length, heads, head_dim = x_shape
    return 2 * directions * batch * chunk_ssd_macs(length, heads, head_dim, b_shape[-1], chunk_size)


@register_flop_formula(torch.ops.mixerbench.ssd_hydra_cpp)
def _hydra_flops(u_shape: list[int], dt_shape: list[int], a_shape: list[int], b_shape: list[int],
                 c_shape: list[int], chunk_size: int, **kwargs) -> int:
    return _ssd_flops([2, *u_shape], a_shape, b_shape, c_shape, chunk_size)
