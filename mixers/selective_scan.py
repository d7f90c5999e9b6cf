"""The selective scan of Mamba (S6) in pure PyTorch, with mamba-ssm's CUDA kernel used where it runs.

    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t        (per channel d, per state n)
    y_t = (sum_n C_t[n] * h_t[n] + D * u_t) * silu(z_t)

Shapes follow mamba-ssm's `selective_scan_fn`: `u, delta, z: (B, D, L)`, `A: (D, N)` real, `B, C: (B, N, L)`,
`D, delta_bias: (D,)`. Inputs in fp16/bf16 are accumulated in float32 and the result is cast back to `u.dtype`.

Six implementations, each with `reverse` (scan from the last step to the first, y in the original order: the
backward direction of Vision Mamba):
- `selective_scan_reference`: a float64 loop written for clarity; the independent reference of the tests.
- `selective_scan_loop`: a loop over `unbind` slices with `addcmul`, differentiated by autograd; it keeps every
  state, so memory is O(B D L N).
- the custom op `mixerbench::selective_scan` (`torch_stream`): its forward runs chunk by chunk of time steps and
  never holds more than `(chunk, B, D, N)`; its backward recomputes the states chunk by chunk and runs the
  reverse scan by hand, as mamba-ssm's kernel does. Counters see it as one op: `FlopCounterMode` through
  `register_flop_formula`, fvcore's jit trace as `mixerbench::selective_scan`.
- mamba-ssm's `selective_scan_fn` (`mamba_ssm_cuda`), when it imports and the tensors are on CUDA.
- Triton kernels on mamba-ssm's CUDA design (`triton`, the custom op `mixerbench::selective_scan_triton` in
  `selective_scan_triton.py`): coalesced tiles along L, a parallel scan per state within a chunk, the state
  carried across chunks in registers, a reverse scan in the backward; `reverse` is native (the tiles are read
  backwards, nothing is flipped).
- The first Triton kernels (`triton_v1`, op `mixerbench::selective_scan_triton_v1` in
  `selective_scan_triton_v1.py`): a state stepped through time, channels strided by L. Kept only to be timed
  against `triton` on a GPU (issue 23); `auto` never picks it.
Both Triton implementations run on CUDA tensors where triton imports, and on CPU tensors only under Triton's
interpreter (`TRITON_INTERPRET=1`), which the tests use. Every other implementation gets `reverse` by flipping
its (B, *, L) inputs and its output along L.

On a CPU a sequential loop beats parallel (Blelloch, log-space) scans: less total work wins over fewer sequential
steps, and stepping over `unbind` views keeps autograd's backward cheap (KERNELS.md).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from . import selective_scan_triton, selective_scan_triton_v1
from .base import CUSTOM_OP_MACS

ScanImpl = Literal["auto", "mamba_ssm_cuda", "triton", "torch_stream", "torch_loop", "triton_v1"]
SCAN_IMPLS: tuple[str, ...] = ("auto", "mamba_ssm_cuda", "triton", "torch_stream", "torch_loop", "triton_v1")
# Implementations whose kernels read the sequence backwards themselves; the others are flipped around.
NATIVE_REVERSE_IMPLS: frozenset[str] = frozenset({"triton"})
_TRITON_IMPLS = ("triton", "triton_v1")

# Elements of one (chunk, B, D, N) buffer; bounds the streaming path's memory (16 MiB in float32).
_CHUNK_ELEMENTS = 1 << 22
_MAX_CHUNK = 64


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


def _compute_dtype(u: Tensor) -> torch.dtype:
    """float64 stays float64 (for tight tests); everything else accumulates in float32."""
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def selective_scan_reference(
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
    """The selective scan as a plain float64 loop over time, written for clarity, not speed.

    Independent of the fast paths (no chunks, no buffers, no hand-written gradients), so tests compare against it.

    Args:
        u: input (B, D, L).
        delta: step sizes before bias and softplus (B, D, L).
        A: state matrix, real (D, N).
        B: input projections (B, N, L).
        C: output projections (B, N, L).
        D: skip weights (D,), or None.
        z: gate (B, D, L), applied as silu(z), or None.
        delta_bias: added to delta before softplus (D,), or None.
        delta_softplus: apply softplus to delta.
        reverse: scan from the last step to the first (the loop runs backwards); y is in the original order.

    Returns:
        y (B, D, L) in float64.
    """
    u, delta, A, B, C = (t.double() for t in (u, delta, A, B, C))
    if delta_bias is not None:
        delta = delta + delta_bias.double()[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    batch, channels, length = u.shape
    h = u.new_zeros(batch, channels, A.shape[1])  # (B, D, N)
    ys = [u.new_empty(0)] * length
    for t in reversed(range(length)) if reverse else range(length):
        dt = delta[:, :, t, None]  # (B, D, 1)
        h = torch.exp(dt * A) * h + dt * B[:, None, :, t] * u[:, :, t, None]  # (B, D, N)
        ys[t] = (h * C[:, None, :, t]).sum(-1)  # (B, D)
    y = torch.stack(ys, dim=-1)  # (B, D, L)
    if D is not None:
        y = y + D.double()[:, None] * u
    if z is not None:
        y = y * F.silu(z.double())
    return y


def _effective_delta(delta: Tensor, delta_bias: Tensor | None, delta_softplus: bool, dtype: torch.dtype) -> Tensor:
    """softplus(delta + bias) in the compute dtype."""
    delta = delta.to(dtype)
    if delta_bias is not None:
        delta = delta + delta_bias.to(dtype)[:, None]
    return F.softplus(delta) if delta_softplus else delta


def selective_scan_loop(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
) -> Tensor:
    """The selective scan as a loop that autograd differentiates (`torch_loop`).

    Discretises all steps at once, then steps `h = addcmul(dBu_t, dA_t, h)` over `unbind` views: autograd's
    backward through `unbind` is one stack, where indexing `x[:, :, t]` per step (mamba-ssm's
    `selective_scan_ref`) makes backward ~30x slower. Keeps all states: O(B D L N) memory. Invisible to op
    counters (they see the unrolled loop); the model uses the custom op instead. Arguments as
    `selective_scan_reference`.

    Returns:
        y (B, D, L) in `u.dtype`.
    """
    ct = _compute_dtype(u)
    uc, A_, Bc, Cc = u.to(ct), A.to(ct), B.to(ct), C.to(ct)
    dt = _effective_delta(delta, delta_bias, delta_softplus, ct)
    dA = torch.exp(rearrange(dt, "b d l -> l b d 1") * A_)  # (L, B, D, N)
    dBu = rearrange(dt * uc, "b d l -> l b d 1") * rearrange(Bc, "b n l -> l b 1 n")  # (L, B, D, N)
    h = uc.new_zeros(dBu.shape[1:])  # (B, D, N)
    hs = []
    for dA_t, dBu_t in zip(dA.unbind(0), dBu.unbind(0)):
        h = torch.addcmul(dBu_t, dA_t, h)
        hs.append(h)
    y = torch.einsum("lbdn,bnl->bdl", torch.stack(hs), Cc)  # (B, D, L)
    if D is not None:
        y = y + D.to(ct)[:, None] * uc
    if z is not None:
        y = y * F.silu(z.to(ct))
    return y.to(u.dtype)


def _chunk_len(batch: int, channels: int, d_state: int, chunk_size: int | None) -> int:
    """Time steps per chunk: at most `_MAX_CHUNK`, and a (chunk, B, D, N) buffer within `_CHUNK_ELEMENTS`."""
    if chunk_size is not None:
        return max(1, chunk_size)
    return max(1, min(_MAX_CHUNK, _CHUNK_ELEMENTS // max(1, batch * channels * d_state)))


class _Prepared:
    """The scan's inputs in the compute dtype, time-major, so every chunk is a contiguous leading-dim slice."""

    def __init__(
        self,
        u: Tensor,
        delta: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        delta_bias: Tensor | None,
        delta_softplus: bool,
    ) -> None:
        ct = _compute_dtype(u)
        self.dtype = ct
        self.u = u.to(ct)  # (B, D, L)
        self.delta = _effective_delta(delta, delta_bias, delta_softplus, ct)  # (B, D, L)
        self.A = A.to(ct)  # (D, N)
        self.delta_t = rearrange(self.delta, "b d l -> l b d").contiguous()  # (L, B, D)
        self.du_t = rearrange(self.delta * self.u, "b d l -> l b d").contiguous()  # (L, B, D)
        self.B_t = rearrange(B.to(ct), "b n l -> l b n").contiguous()  # (L, B, N)
        self.C_t = rearrange(C.to(ct), "b n l -> l b n").contiguous()  # (L, B, N)
        self.batch, self.channels, self.length = u.shape
        self.d_state = A.shape[1]

    def decay(self, s: int, e: int, out: Tensor) -> Tensor:
        """exp(delta_t * A) for steps s..e-1 into `out` (T, B, D, N)."""
        torch.mul(self.delta_t[s:e, :, :, None], self.A, out=out)
        return out.exp_()

    def drive(self, s: int, e: int, out: Tensor) -> Tensor:
        """delta_t * u_t * B_t for steps s..e-1 into `out` (T, B, D, N)."""
        return torch.mul(self.du_t[s:e, :, :, None], self.B_t[s:e, :, None, :], out=out)


class _ChunkBuffer:
    """A reused (T, B, D, N) buffer and its per-step views, made once: `unbind` per chunk costs as much as the
    arithmetic of a step at small B x D."""

    def __init__(self, like: Tensor, chunk: int, batch: int, channels: int, d_state: int) -> None:
        self.data = like.new_empty(chunk, batch, channels, d_state)  # (T, B, D, N)
        self.steps = self.data.unbind(0)

    def first(self, T: int) -> Tensor:
        """The first T steps, (T, B, D, N)."""
        return self.data[:T]


def _scan_steps_(h_steps: Sequence[Tensor], a_steps: Sequence[Tensor], h0: Tensor) -> None:
    """In place: each `h_steps[t]` holds the drive on entry and h_t = a_t h_{t-1} + drive on exit, from `h0`."""
    h_prev = h0
    for h, a in zip(h_steps, a_steps):
        h.addcmul_(a, h_prev)
        h_prev = h


def _readout(states: Tensor, C_t: Tensor, out: Tensor) -> Tensor:
    """sum_n h_t[n] C_t[n]: (T, B, D, N) x (T, B, N) -> `out` (T, B, D).

    A dot product over the last dim: bmm with these matrix-vector shapes is ~2x slower on CPU.
    """
    return torch.linalg.vecdot(states, C_t[:, :, None, :], out=out)


def _stream_core(p: _Prepared, chunk: int, keep_chunk_starts: bool = False) -> tuple[Tensor, list[Tensor]]:
    """sum_n C_t h_t for all t, chunk by chunk: returns y_core (L, B, D) and, if asked, the state before each chunk."""
    L, Bsz, Dch, N = p.length, p.batch, p.channels, p.d_state
    decay_buf, state_buf = (_ChunkBuffer(p.u, min(chunk, L), Bsz, Dch, N) for _ in range(2))
    y_core = p.u.new_empty(L, Bsz, Dch)  # (L, B, D)
    h = p.u.new_zeros(Bsz, Dch, N)  # (B, D, N)
    starts = []
    for s in range(0, L, chunk):
        T = min(chunk, L - s)
        if keep_chunk_starts:
            starts.append(h.clone())
        p.decay(s, s + T, decay_buf.first(T))
        p.drive(s, s + T, state_buf.first(T))
        _scan_steps_(state_buf.steps[:T], decay_buf.steps[:T], h)
        _readout(state_buf.first(T), p.C_t[s : s + T], y_core[s : s + T])
        h.copy_(state_buf.steps[T - 1])  # the buffers are overwritten by the next chunk
    return y_core, starts


def _epilogue(y_core: Tensor, u: Tensor, D: Tensor | None, z: Tensor | None) -> Tensor:
    """(y_core + D u) * silu(z), in the compute dtype; y_core is (B, D, L)."""
    y = y_core if D is None else y_core + D.to(u.dtype)[:, None] * u
    return y if z is None else y * F.silu(z.to(u.dtype))


def selective_scan_stream(
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
    chunk_size: int | None = None,
) -> Tensor:
    """The selective scan without autograd, chunk by chunk of time steps (the custom op's forward).

    exp(delta A) and delta B u are formed for one chunk at a time into two reused (T, B, D, N) buffers and the
    recurrence runs in place, so the (B, D, L, N) tensor never exists. Arguments as `selective_scan_reference`.

    Args:
        chunk_size: time steps per chunk; None picks up to 64 within a 16 MiB buffer.

    Returns:
        y (B, D, L) in `u.dtype`, contiguous.
    """
    with torch.no_grad():
        p = _Prepared(u, delta, A, B, C, delta_bias, delta_softplus)
        chunk = _chunk_len(p.batch, p.channels, p.d_state, chunk_size)
        y_core, _ = _stream_core(p, chunk)
        y_core = rearrange(y_core, "l b d -> b d l")  # (B, D, L)
        return _epilogue(y_core, p.u, D, z).to(u.dtype).contiguous()


def _stream_backward(
    dy: Tensor,
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
    chunk_size: int | None = None,
) -> tuple[Tensor | None, ...]:
    """Gradients of the scan, recomputing states chunk by chunk and running the reverse scan by hand.

    With g_t = dL/dh_t (through h_{t+1} as well): g_t = C_t dy_t + exp(delta_{t+1} A) g_{t+1}, run backwards in
    place; then d(delta_t A) = g_t h_{t-1} exp(delta_t A) and d(delta_t B_t u_t) = g_t. A first pass keeps only the
    state at each chunk start; each chunk's states are recomputed from it, so memory stays O(B D N (L / T + T)).

    Returns:
        (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias), None where the input was None.
    """
    p = _Prepared(u, delta, A, B, C, delta_bias, delta_softplus)
    ct, L, Bsz, Dch, N = p.dtype, p.length, p.batch, p.channels, p.d_state
    chunk = _chunk_len(Bsz, Dch, N, chunk_size)
    dy = dy.to(ct)
    y_core, starts = _stream_core(p, chunk, keep_chunk_starts=True)
    y_core = rearrange(y_core, "l b d -> b d l")  # (B, D, L)

    dz = None
    if z is not None:
        zc = z.to(ct)
        sig = torch.sigmoid(zc)
        pre_gate = _epilogue(y_core, p.u, D, None)
        dz = (dy * pre_gate * sig * (1 + zc * (1 - sig))).to(z.dtype)
        dy = dy * zc * sig  # d loss / d (y_core + D u)
    dD = None if D is None else (dy * p.u).sum((0, 2)).to(D.dtype)
    du = dy * D.to(ct)[:, None] if D is not None else torch.zeros_like(p.u)  # (B, D, L)
    dy_t = rearrange(dy, "b d l -> l b d").contiguous()  # (L, B, D)

    decay_buf, state_buf, grad_buf = (_ChunkBuffer(p.u, min(chunk, L), Bsz, Dch, N) for _ in range(3))
    d_delta_t = p.u.new_empty(L, Bsz, Dch)  # (L, B, D)
    gB_t = p.u.new_empty(L, Bsz, Dch)  # (L, B, D): sum_n g_t B_t
    dB_t = p.u.new_empty(L, Bsz, N)  # (L, B, N)
    dC_t = p.u.new_empty(L, Bsz, N)  # (L, B, N)
    dA = torch.zeros_like(p.A)  # (D, N)
    carry = p.u.new_zeros(Bsz, Dch, N)  # exp(delta_e A) g_e from the chunk after, (B, D, N)
    for i in reversed(range(len(starts))):
        s = i * chunk
        e = min(s + chunk, L)
        T = e - s
        decay = p.decay(s, e, decay_buf.first(T))
        states = p.drive(s, e, state_buf.first(T))
        _scan_steps_(state_buf.steps[:T], decay_buf.steps[:T], starts[i])

        # dC_t[n] = sum_d dy_t[d] h_t[d, n]
        torch.matmul(dy_t[s:e, :, None, :], states, out=dC_t[s:e, :, None, :])
        # Reverse scan in place: grad_buf holds C_t dy_t on entry and g_t on exit.
        g = torch.mul(dy_t[s:e, :, :, None], p.C_t[s:e, :, None, :], out=grad_buf.first(T))  # (T, B, D, N)
        g_steps, a_steps = grad_buf.steps[:T], decay_buf.steps[:T]
        g_steps[-1].add_(carry)
        _scan_steps_(g_steps[-2::-1], a_steps[:0:-1], g_steps[-1])  # g_t += a_{t+1} g_{t+1}, t = T-2 .. 0
        carry = a_steps[0] * g_steps[0]

        # sum_n g_t B_t, and dB_t[n] = sum_d g_t[d, n] delta_t[d] u_t[d]
        torch.linalg.vecdot(g, p.B_t[s:e, :, None, :], out=gB_t[s:e])
        torch.matmul(p.du_t[s:e, :, None, :], g, out=dB_t[s:e, :, None, :])

        # d(delta_t A) = g_t h_{t-1} exp(delta_t A), reusing the decay buffer.
        d_pre = decay.mul_(g)
        d_pre[1:].mul_(states[:-1])
        d_pre[0].mul_(starts[i])
        torch.linalg.vecdot(d_pre, p.A, out=d_delta_t[s:e])  # sum_n d_pre A
        dA.add_((d_pre.mul_(p.delta_t[s:e, :, :, None])).sum((0, 1)))  # sum_{t, b} d_pre delta

    d_delta = rearrange(d_delta_t, "l b d -> b d l")  # (B, D, L)
    gB = rearrange(gB_t, "l b d -> b d l")  # (B, D, L)
    d_delta = d_delta + gB * p.u
    du = du + gB * p.delta
    if delta_softplus:
        pre = delta.to(ct) if delta_bias is None else delta.to(ct) + delta_bias.to(ct)[:, None]
        d_delta = d_delta * torch.sigmoid(pre)
    d_bias = None if delta_bias is None else d_delta.sum((0, 2)).to(delta_bias.dtype)
    return (
        du.to(u.dtype),
        d_delta.to(delta.dtype),
        dA.to(A.dtype),
        rearrange(dB_t, "l b n -> b n l").to(B.dtype),
        rearrange(dC_t, "l b n -> b n l").to(C.dtype),
        dD,
        dz,
        d_bias,
    )


@torch.library.custom_op("mixerbench::selective_scan", mutates_args=())
def _selective_scan_op(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
) -> Tensor:
    return selective_scan_stream(u, delta, A, B, C, D, z, delta_bias, delta_softplus)


@_selective_scan_op.register_fake
def _selective_scan_fake(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
) -> Tensor:
    return u.new_empty(u.shape)


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    u, delta, A, B, C, D, z, delta_bias, delta_softplus = inputs
    ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias)
    ctx.delta_softplus = delta_softplus


def _meta_backward(dy: Tensor, u: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, z: Tensor | None,
                   delta_bias: Tensor | None) -> tuple[Tensor | None, ...]:
    """The backward on the meta device (counting a training step): shapes only, in one pass.

    It issues the two contractions `_stream_backward` runs (dC_t and dB_t, the only ops FlopCounterMode counts
    there) over the whole length at once, so the count equals a real device's, without stepping the recurrence
    through thousands of meta ops (~50 s for one mamba step at 4,096 tokens).
    """
    batch, channels, length = u.shape
    states = u.new_empty(length, batch, channels, A.shape[1])  # (L, B, D, N)
    dy_t = u.new_empty(length, batch, 1, channels)  # (L, B, 1, D)
    torch.matmul(dy_t, states)  # dC_t
    torch.matmul(dy_t, states)  # dB_t (delta u in place of dy)
    like = (u, u, A, B, C, D, z, delta_bias)
    return tuple(None if t is None else torch.empty_like(t) for t in like)


def _backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:
    u, delta, A, B, C, D, z, delta_bias = ctx.saved_tensors
    if u.device.type == "meta":
        return (*_meta_backward(dy, u, A, B, C, D, z, delta_bias), None)
    with torch.no_grad():
        grads = _stream_backward(dy, u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus)
    return (*grads, None)


_selective_scan_op.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula([torch.ops.mixerbench.selective_scan, torch.ops.mixerbench.selective_scan_triton,
                        torch.ops.mixerbench.selective_scan_triton_v1])
def _selective_scan_flop_formula(
    u_shape: list[int], delta_shape: list[int], A_shape: list[int], *args, **kwargs
) -> int:
    batch, d_inner, length = u_shape
    return selective_scan_flops(batch, d_inner, length, A_shape[1])


def _selective_scan_macs_from_shapes(shapes: list[tuple[int, ...] | None]) -> int:
    """MACs of a selective-scan op (`mixerbench::selective_scan` and the others taking the same inputs) from the
    shapes of its inputs (u first, A third), for fvcore."""
    u_shape, A_shape = shapes[0], shapes[2]
    if u_shape is None or A_shape is None:
        raise ValueError("selective scan op: the counter gave no shapes for u and A")
    batch, d_inner, length = u_shape
    return selective_scan_flops(batch, d_inner, length, A_shape[1]) // 2


CUSTOM_OP_MACS["mixerbench::selective_scan"] = _selective_scan_macs_from_shapes
CUSTOM_OP_MACS["mixerbench::selective_scan_triton"] = _selective_scan_macs_from_shapes
CUSTOM_OP_MACS["mixerbench::selective_scan_triton_v1"] = _selective_scan_macs_from_shapes
# mamba-ssm's kernel is an autograd Function taking the same (u, delta, A, ...) inputs; a jit trace names it
# prim::PythonOp.SelectiveScanFn, so fvcore counts it by the same formula on CUDA (not checked on a GPU yet).
CUSTOM_OP_MACS["prim::PythonOp.SelectiveScanFn"] = _selective_scan_macs_from_shapes


@functools.cache
@functools.lru_cache(maxsize=1)
def _mamba_ssm_selective_scan_fn() -> Callable[..., Tensor] | None:
    """mamba-ssm's CUDA `selective_scan_fn`, or None where mamba-ssm (a CUDA build) does not import.

    Cached: a failed import is retried (and the file system searched) on every call otherwise."""
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except ImportError:
        return None
    return selective_scan_fn


def resolve_scan_impl(impl: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The implementation `selective_scan` runs for `impl` on tensors of `device` and `dtype`.

    `auto` picks, for fp32/fp16/bf16 CUDA tensors, `mamba_ssm_cuda` when mamba-ssm imports, else `triton` when
    triton imports; everything else (CPU, float64) gets `torch_stream`. `triton_v1` runs only when asked for.
    Raises if `mamba_ssm_cuda`, `triton` or `triton_v1` is asked for where it cannot run (the Triton kernels run
    on CPU tensors only under `TRITON_INTERPRET=1`). On the meta device (shapes only, for counting) `triton`,
    `triton_v1`, `torch_stream` and `torch_loop` stand, and `auto` and `mamba_ssm_cuda` give `torch_stream`: its
    op has a fake and the same flop formula as mamba-ssm's kernel.
    """
    if impl not in SCAN_IMPLS:
        raise ValueError(f"unknown scan impl {impl!r}; choose one of {', '.join(SCAN_IMPLS)}")
    if device.type == "meta":
        # Shape only (counting builds the model on meta): nothing runs, so nothing needs CUDA or triton. The Triton
        # impls keep their ops (they have fakes and the flop formula); mamba-ssm's kernel has no meta
        # implementation, so `mamba_ssm_cuda` (and `auto`) count through `torch_stream`'s op, same formula.
        return impl if impl in ("triton", "triton_v1", "torch_stream", "torch_loop") else "torch_stream"
    kernel_runs = (
        device.type == "cuda"
        and dtype in (torch.float32, torch.float16, torch.bfloat16)
        and _mamba_ssm_selective_scan_fn() is not None
    )
    triton_problem = selective_scan_triton.triton_unavailable_reason(device, dtype)
    if impl == "auto":
        if kernel_runs:
            return "mamba_ssm_cuda"
        return "triton" if device.type == "cuda" and triton_problem is None else "torch_stream"
    if impl in _TRITON_IMPLS and triton_problem is not None:
        raise RuntimeError(f"scan impl {impl!r} cannot run on {dtype} tensors on {device}: {triton_problem}")
    if impl == "mamba_ssm_cuda" and not kernel_runs:
        raise RuntimeError(
            f"scan impl 'mamba_ssm_cuda' needs fp32/fp16/bf16 CUDA tensors (got {dtype} on {device}) and an "
            f"importable mamba-ssm ({'found' if _mamba_ssm_selective_scan_fn() else 'not importable here'}); "
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

    Args:
        u, delta, A, B, C, D, z, delta_bias, delta_softplus: as `selective_scan_reference`.
        impl: `auto` (on CUDA mamba-ssm's kernel when it imports, else `triton`; `torch_stream` otherwise),
            `mamba_ssm_cuda`, `triton` (the Triton kernels, op `mixerbench::selective_scan_triton`), `triton_v1`
            (the first Triton kernels, kept for GPU comparison), `torch_stream` (the custom op
            `mixerbench::selective_scan`) or `torch_loop` (autograd through the loop).
        reverse: scan from the last step to the first, y in the original order: equal to flipping u, delta, B,
            C, z along L, scanning, and flipping y back, which is what implementations without a native reverse
            (all but `triton`, see `NATIVE_REVERSE_IMPLS`) do.

    Returns:
        y (B, D, L) in `u.dtype`, and the name of the implementation that ran.
    """
    name = resolve_scan_impl(impl, u.device, u.dtype)
    if name == "triton":
        y, _ = torch.ops.mixerbench.selective_scan_triton(
            u, delta, A, B, C, D, z, delta_bias, delta_softplus, reverse
        )
        return y, name
    if reverse:
        u, delta, B, C, z = (_flip_time(t) for t in (u, delta, B, C, z))
    if name == "mamba_ssm_cuda":
        scan_fn = _mamba_ssm_selective_scan_fn()
        y = scan_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    elif name == "triton_v1":
        y, _ = torch.ops.mixerbench.selective_scan_triton_v1(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    elif name == "torch_loop":
        y = selective_scan_loop(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    else:
        y = torch.ops.mixerbench.selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    return (y.flip(-1) if reverse else y), name
