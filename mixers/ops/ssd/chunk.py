"""SSD in chunks (Mamba-2's "state-space duality", `ssd_minimal_discrete` in state-spaces/mamba): matrix products
inside each chunk, one state carried across chunks, in plain PyTorch so it runs and differentiates anywhere and the
counters see every product.

With one scalar log decay a_t per head and step, the recurrence `h_t = exp(a_t) h_{t-1} + x_t b_t^T`,
`y_t = h_t c_t` unrolls inside a chunk of T steps to a (T x T) matrix, the attention-like dual form:

    y_i = sum_{j <= i} (c_i . b_j) exp(a_{j+1} + ... + a_i) x_j        (inside the chunk)
          + exp(a_1 + ... + a_i) h_start c_i                           (the state the chunk starts from)

and the chunk hands on h_end = exp(a_1 + ... + a_T) h_start + sum_j exp(a_{j+1} + ... + a_T) x_j b_j^T. Every
exponent is a segment sum of decays <= 0, built by summing the decays themselves (`segsum`), never as a ratio of
cumulative decays or a difference of long prefix sums, so nothing overflows and nothing cancels. Four products:
`c b^T` once for all heads (B and C are shared, Mamba-2's single group), the masked decay matrix times x, the
chunk states, and the states read out through c. The chunk-to-chunk step is element-wise, one per chunk.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor


def segsum(a: Tensor) -> Tensor:
    """Segment sums of `a` over its last dimension: `out[..., i, j] = a_{j+1} + ... + a_i` for j <= i (0 on the
    diagonal) and -inf above it, so `exp(out)` is the causal decay matrix.

    Built as a cumulative sum of the masked decays themselves rather than `cumsum(a)_i - cumsum(a)_j`: each entry
    is a sum of the decays in its own segment, exactly <= 0 when they are, with no cancellation of long sums.

    Args:
        a: (..., T).

    Returns:
        (..., T, T).
    """
    T = a.shape[-1]
    ones = torch.ones(T, T, dtype=torch.bool, device=a.device)
    # a_i where j < i, else 0, written once (a masked_fill of the expanded a would copy it first)
    rows = torch.where(ones.tril(-1), a[..., :, None], 0.0)  # (..., T_i, T_j)
    seg = rows.cumsum(dim=-2)  # (..., T_i, T_j): sum of a_s for j < s <= i
    return seg.masked_fill_(~ones.tril(0), float("-inf"))


class _DecayMatrix(torch.autograd.Function):
    """`exp(segsum(a))` with a backward written out: autograd's runs seven passes over the (T x T) matrix (the
    exp, both masks, cumsum's flip-cumsum-flip, the sum over the expanded axis); this one four."""

    @staticmethod
    def forward(ctx, a: Tensor) -> Tensor:
        decay = segsum(a).exp_()
        ctx.save_for_backward(decay)
        return decay

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (decay,) = ctx.saved_tensors
        T = decay.shape[-1]
        g = grad * decay  # d loss / d segsum, zero above the diagonal
        # a_s sits in the segments [j, i] with j < s <= i: its gradient sums g[i, j] over j < s, then over i >= s.
        before = g.cumsum(-1)[..., :, :-1]  # (..., T_i, T - 1): sum of g[i, j] over j < s, at column s - 1
        reached = torch.ones(T, T - 1, dtype=torch.bool, device=g.device).tril(-1)  # i >= s
        later = torch.where(reached, before, 0.0).sum(-2)  # (..., T - 1): a_1 .. a_{T-1}
        return torch.cat([torch.zeros_like(later[..., :1]), later], dim=-1)  # a_0 starts every segment it is in


def decay_matrix(a: Tensor) -> Tensor:
    """`exp(segsum(a))`, the causal decay matrix of each chunk: (..., T) -> (..., T, T), zero above the diagonal."""
    return _DecayMatrix.apply(a)


def _chunk_length(length: int, chunk_size: int) -> int:
    """The chunk length used for `length` steps: `chunk_size`, or the whole sequence when it is shorter."""
    return max(1, min(chunk_size, length))


def chunk_ssd_macs(length: int, heads: int, head_dim: int, d_state: int, chunk_size: int) -> int:
    """MACs of `chunk_ssd` for one sequence, on the sequence padded to whole chunks of T steps: per padded step,
    T N (`c b^T`, shared by the heads) + T H P (decay matrix times x); with more than one chunk, per step H P N into
    the chunk states, and per step of every chunk but the first H P N to read the state out (a single chunk has no
    state). Decays, exps and the chunk-to-chunk step are element-wise.

    Args:
        length: L, before padding.
        heads: H.
        head_dim: P per head.
        d_state: N.
        chunk_size: T as passed to `chunk_ssd` (a shorter sequence is one chunk of its own length).
    """
    T = _chunk_length(length, chunk_size)
    padded = math.ceil(length / T) * T
    inner = heads * head_dim
    states = 0 if padded == T else (2 * padded - T) * inner * d_state
    return padded * T * (d_state + inner) + states


def chunk_ssd(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int = 64) -> Tensor:
    """Causal SSD in chunks; arguments and result as `naive_ssd`.

    The sequence is padded at the end to whole chunks (padded steps come after every real one and carry x = 0, so
    they change no real output) and cropped back. A sequence shorter than `chunk_size` is one chunk.

    Args:
        x: inputs times dt (batch, L, H, P).
        a: log decays A dt (batch, L, H), <= 0.
        b: input maps (batch, L, N), shared by all heads.
        c: output maps (batch, L, N), shared by all heads.
        chunk_size: steps T per chunk.

    Returns:
        y (batch, L, H, P) in x's dtype, accumulated in float32 (float64 for float64 inputs).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_ssd: chunk_size must be >= 1, got {chunk_size}")
    dtype = x.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    length = x.shape[1]
    T = _chunk_length(length, chunk_size)
    pad = math.ceil(length / T) * T - length
    if pad:  # padded steps come after every real one with x = 0 and a decay of 1: they change no real output
        x, a, b, c = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, a, b, c))
    x = rearrange(x.to(compute), "z (n t) h p -> z h n t p", t=T)  # (batch, H, n, T, P)
    a = rearrange(a.to(compute), "z (n t) h -> z h n t", t=T)  # (batch, H, n, T)
    b, c = (rearrange(m.to(compute), "z (n t) s -> z n t s", t=T) for m in (b, c))  # (batch, n, T, N) each

    # Inside each chunk: the (T x T) dual form, (c_i . b_j) times the decay from step j to step i.
    decay = decay_matrix(a)  # (batch, H, n, T_i, T_j), zero above the diagonal
    scores = c @ b.transpose(-1, -2)  # (batch, n, T_i, T_j), one for all heads
    y = (decay * scores[:, None]) @ x  # (batch, H, n, T, P)
    n = x.shape[2]
    if n == 1:  # one chunk: no state comes in, none goes on
        return rearrange(y, "z h n t p -> z (n t) h p")[:, :length].to(dtype)

    # What each chunk adds to the state: every step's x b^T decayed to the chunk's end. The decay from step j is the
    # sum of the decays after it, summed from the chunk's end (not read off the decay matrix: a slice of it would
    # cost its backward a zero-filled copy of the whole matrix). The last chunk's is not needed; computing it costs
    # one chunk's product, slicing x instead a zero-filled copy of x in the backward.
    to_end = F.pad(a[..., 1:].flip(-1).cumsum(-1).flip(-1), (0, 1)).exp()[..., None]  # (batch, H, n, T, 1)
    added = (x * to_end).transpose(-1, -2) @ b[:, None]  # (batch, H, n, P, N)

    # Across chunks: the state each chunk after the first starts from, one element-wise step per chunk.
    chunk_decay = a.sum(-1).exp()[..., None, None]  # (batch, H, n, 1, 1): the whole chunk's decay
    state = added[:, :, 0]  # (batch, H, P, N): the state the second chunk starts from
    starts = [state]
    for i in range(1, n - 1):
        state = chunk_decay[:, :, i] * state + added[:, :, i]
        starts.append(state)
    starts = torch.stack(starts, dim=2)  # (batch, H, n - 1, P, N)

    # The starting state read out at every step, decayed from the chunk's start through that step.
    from_start = a[:, :, 1:].cumsum(-1).exp()[..., None]  # (batch, H, n - 1, T, 1): a sum of decays <= 0
    read = (starts @ c[:, None, 1:].transpose(-1, -2)).transpose(-1, -2) * from_start  # (batch, H, n - 1, T, P)
    y[:, :, 1:] += read  # in place: the product's backward does not read y, and a cat would copy it whole
    return rearrange(y, "z h n t p -> z (n t) h p")[:, :length].to(dtype)
