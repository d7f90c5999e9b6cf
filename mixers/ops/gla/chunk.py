"""GLA in chunks: matrix products inside each chunk, a recurrent state across chunks (fla's `chunk` form), in plain
PyTorch, so it runs and differentiates anywhere and the counters see every product.

With b_t the cumulative log gate from the start of the chunk to step t (inclusive), a query at step i of a chunk
reads

    o_i = scale * ( sum_{j <= i} (q_i * exp(b_i - b_j)) . k_j  v_j       (inside the chunk)
                    + (q_i * exp(b_i)) S_prev )                          (the state the chunk starts from)

and the chunk hands on S = diag(exp(b_T)) S_prev + sum_j (k_j * exp(b_T - b_j)) v_j^T. Every exponent is <= 0 for
gates <= 0, so nothing overflows, unlike the `q exp(b)`, `k exp(-b)` factorisation, whose exp(-b) grows with the
chunk. The price: the intra-chunk scores are a batched matmul of each query with its own decayed keys, a
`(T, T, K)` tensor per chunk; fla pays the same only inside its 16-step sub-chunks, hence the default T = 16.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor


def chunk_gla_macs(heads: int, length: int, key_dim: int, value_dim: int, chunk_size: int) -> int:
    """MACs of `chunk_gla` for one sequence: per head and padded step, T K (scores) + T V (scores x values)
    + K V (into the state) + K V (the state read by the queries). Gates, exps and the state decay are element-wise.

    Args:
        heads: H.
        length: L, before padding to a multiple of `chunk_size`.
        key_dim: K per head.
        value_dim: V per head.
        chunk_size: T.
    """
    padded = math.ceil(length / chunk_size) * chunk_size
    return heads * padded * (chunk_size * (key_dim + value_dim) + 2 * key_dim * value_dim)


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
    q, k, v, g = (rearrange(F.pad(t.to(compute), (0, 0, 0, pad)), "b h (n t) d -> b h n t d", t=T)
                  for t in (q, k, v, g))  # (B, H, n, T, K or V)
    q = q * scale
    b = g.cumsum(dim=-2)  # (B, H, n, T, K): log decay from the chunk start through step t

    # Inside each chunk: query i against key j <= i decayed by exp(b_i - b_j).
    later = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # (T_i, T_j): j > i
    rel = (b[..., :, None, :] - b[..., None, :, :]).masked_fill(later[:, :, None], float("-inf"))  # (.., T, T, K)
    k_rel = k[..., None, :, :] * rel.exp()  # (B, H, n, T_i, T_j, K)
    scores = (q[..., :, None, :] @ k_rel.transpose(-1, -2)).squeeze(-2)  # (B, H, n, T_i, T_j)
    out = scores @ v  # (B, H, n, T, V)

    # Across chunks: what each chunk adds to the state, then the state each chunk starts from.
    b_last = b[..., -1:, :]  # (B, H, n, 1, K)
    added = (k * (b_last - b).exp()).transpose(-1, -2) @ v  # (B, H, n, K, V)
    decay = b_last.squeeze(-2).exp()[..., None]  # (B, H, n, K, 1)
    state = added.new_zeros(added[:, :, 0].shape)  # (B, H, K, V)
    starts = []
    for c in range(added.shape[2]):
        starts.append(state)
        state = decay[:, :, c] * state + added[:, :, c]
    out = out + (q * b.exp()) @ torch.stack(starts, dim=2)  # (B, H, n, T, V)
    return rearrange(out, "b h n t d -> b h (n t) d")[:, :, :length].to(dtype)
