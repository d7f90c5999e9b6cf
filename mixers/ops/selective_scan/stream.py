"""The custom op `mixerbench::selective_scan` (`torch_stream`): the selective scan chunk by chunk of time steps in
PyTorch, with a hand-written backward.

Its forward never holds more than `(chunk, B, D, N)`; its backward recomputes the states chunk by chunk and runs
the reverse scan by hand, as mamba-ssm's kernel does. Counters see it as one op: `FlopCounterMode` through the
formula registered in `__init__.py`, fvcore's jit trace as `mixerbench::selective_scan`. On a CPU a sequential
loop beats parallel (Blelloch, log-space) scans: less total work wins over fewer sequential steps (KERNELS.md);
the loop here still steps from Python, which the compiled `cpu_kernel` removes.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from ..precision import compute_dtype
from .naive import effective_delta

# Elements of one (chunk, B, D, N) buffer; bounds the streaming path's memory (16 MiB in float32).
_CHUNK_ELEMENTS = 1 << 22
_MAX_CHUNK = 64


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
        ct = compute_dtype(u)
        self.dtype = ct
        self.u = u.to(ct)  # (B, D, L)
        self.delta = effective_delta(delta, delta_bias, delta_softplus, ct)  # (B, D, L)
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
