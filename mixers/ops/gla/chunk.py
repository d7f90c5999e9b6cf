"""GLA in chunks: matrix products inside each chunk, a recurrent state across chunks (fla's `chunk` form), in plain
PyTorch, so it runs and differentiates anywhere and the counters see every product.

With b_t the cumulative log gate from the start of the chunk to step t (inclusive), a query at step i of a chunk
reads

    o_i = scale * ( sum_{j <= i} (q_i * exp(b_i - b_j)) . k_j  v_j       (inside the chunk)
                    + (q_i * exp(b_i)) S_prev )                          (the state the chunk starts from)

and the chunk hands on S = diag(exp(b_T)) S_prev + sum_j (k_j * exp(b_T - b_j)) v_j^T. The intra-chunk scores use
the `q exp(b)`, `k exp(-b)` factorisation (one matmul per chunk, as fla's sub-chunks) only while every |b| within a
chunk is small enough that exp(-b) cannot overflow; with stronger decays they take the relative form, whose
exponents are all <= 0, at the price of a `(T, T, K)` tensor per chunk (see `_intra_chunk_scores`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor


def chunk_gla_macs(heads: int, length: int, key_dim: int, value_dim: int, chunk_size: int) -> int:
    """MACs of `chunk_gla` for one sequence: per head and padded step, T K (scores) + T V (scores x values); per
    step of every chunk but the last, K V (into the state), and of every chunk but the first, K V (the state read
    by the queries). Gates, exps and the state decay are element-wise.

    Args:
        heads: H.
        length: L, before padding to a multiple of `chunk_size`.
        key_dim: K per head.
        value_dim: V per head.
        chunk_size: T.
    """
    padded = math.ceil(length / chunk_size) * chunk_size
    carried = max(padded - chunk_size, 0)  # the steps of every chunk but the first, which starts from no state
    return heads * (padded * chunk_size * (key_dim + value_dim) + 2 * carried * key_dim * value_dim)


# The largest |b| (log decay within a chunk) at which the factorised intra-chunk form is used: exp(+-30) ~ 1e13
# keeps both factors far inside float32's range (1e38) and its normal numbers (1e-38); float64 reaches further.
_FACTORISED_LOG_DECAY_LIMIT = {torch.float32: 30.0, torch.float64: 300.0}


def _values_unreadable(t: Tensor) -> bool:
    """True where the choice of form cannot read `t`: on the meta device (counting: no values) and while a CUDA graph
    is captured (reading a value synchronises, which capture forbids). Both take the factorised form, the one the
    MACs count; a captured graph replayed on decays past the limit would give non-finite outputs, so graphs here
    serve timing (experiments/measure/graphed.py), not training on arbitrary gates."""
    return t.device.type == "meta" or (t.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def _intra_chunk_scores(q: Tensor, k: Tensor, b: Tensor, compute: torch.dtype) -> Tensor:
    """Scores of query i against key j <= i inside each chunk, q_i . (k_j * exp(b_i - b_j)), (B, H, n, T, T).

    Where every chunk's log decay stays within `_FACTORISED_LOG_DECAY_LIMIT` (the usual case: gates are
    logsigmoid / 16 by default) this is one batched matmul, (q exp(b)) (k exp(-b))^T, masked: T K work per step as
    `chunk_gla_macs` counts. Otherwise (decays strong enough that exp(-b) could overflow) it takes the exact
    relative form, exp(b_i - b_j) per (i, j, K): T x more element-wise work, every exponent <= 0.
    """
    T = q.shape[-2]
    later = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # (T_i, T_j): j > i
    if _values_unreadable(b) or -b.amin() <= _FACTORISED_LOG_DECAY_LIMIT[compute]:
        scores = (q * b.exp()) @ (k * (-b).exp()).transpose(-1, -2)  # (B, H, n, T_i, T_j)
        return scores.masked_fill(later, 0.0)
    rel = (b[..., :, None, :] - b[..., None, :, :]).masked_fill(later[:, :, None], float("-inf"))  # (.., T, T, K)
    k_rel = k[..., None, :, :] * rel.exp()  # (B, H, n, T_i, T_j, K)
    return (q[..., :, None, :] @ k_rel.transpose(-1, -2)).squeeze(-2)  # (B, H, n, T_i, T_j)


def chunk_gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float | None = None, chunk_size: int = 16,
              ) -> Tensor:
    """Causal gated linear attention in chunks; arguments and result as `naive_recurrent_gla`.

    The sequence is padded at the end to a multiple of `chunk_size` (padded steps come after every real one, so
    they change no real output) and cropped back.

    Args:
        q: queries (B, H, L, K).
        k: keys (B, H, L, K).
        v: values (B, H, L, V).
        g: log forget gates (B, H, L, K), <= 0.
        scale: multiplies q; None gives K ** -0.5.
        chunk_size: steps T per chunk.

    Returns:
        o (B, H, L, V) in q's dtype, accumulated in float32 (float64 for float64 inputs).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_gla: chunk_size must be >= 1, got {chunk_size}")
    dtype = q.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    length, T = q.shape[2], chunk_size
    pad = math.ceil(length / T) * T - length
    q, k, v, g = (rearrange(F.pad(t.to(compute), (0, 0, 0, pad)) if pad else t.to(compute),
                            "b h (n t) d -> b h n t d", t=T) for t in (q, k, v, g))  # (B, H, n, T, K or V)
    q = q * scale
    b = g.cumsum(dim=-2)  # (B, H, n, T, K): log decay from the chunk start through step t

    out = _intra_chunk_scores(q, k, b, compute) @ v  # (B, H, n, T, V)

    # Across chunks: what each chunk but the last adds to the state, then the state each chunk but the first
    # starts from (the first starts from zero: nothing to read).
    n = q.shape[2]
    if n > 1:
        b_last = b[:, :, :-1, -1:, :]  # (B, H, n - 1, 1, K)
        added = (k[:, :, :-1] * (b_last - b[:, :, :-1]).exp()).transpose(-1, -2) @ v[:, :, :-1]  # (B, H, n-1, K, V)
        decay = b_last[:, :, 1:].squeeze(-2).exp()[..., None]  # (B, H, n - 2, K, 1): chunks 1 .. n - 2
        states = [added[:, :, 0]]  # (B, H, K, V): the state chunk 1 starts from
        for c in range(1, n - 1):
            states.append(decay[:, :, c - 1] * states[-1] + added[:, :, c])
        read = (q[:, :, 1:] * b[:, :, 1:].exp()) @ torch.stack(states, dim=2)  # (B, H, n - 1, T, V)
        out = torch.cat([out[:, :, :1], out[:, :, 1:] + read], dim=2)
    return rearrange(out, "b h n t d -> b h (n t) d")[:, :, :length].to(dtype)
