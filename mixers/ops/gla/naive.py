"""The GLA recurrence step by step, as fla's `naive_recurrent_gla`: the independent reference of `chunk_gla`."""
from __future__ import annotations

import torch
from torch import Tensor


def naive_recurrent_gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float | None = None) -> Tensor:
    """Causal gated linear attention, one time step at a time.

        S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = scale * q_t^T S_t,    S_0 = 0

    Args:
        q: queries (B, H, L, K).
        k: keys (B, H, L, K).
        v: values (B, H, L, V).
        g: log forget gates (B, H, L, K), <= 0 for a decaying state.
        scale: multiplies q; None gives K ** -0.5.

    Returns:
        o (B, H, L, V) in q's dtype, computed in float64 for float64 inputs and float32 otherwise.
    """
    dtype = q.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v, g = (t.to(compute) for t in (q, k, v, g))
    batch, heads, length, key_dim = q.shape
    state = q.new_zeros(batch, heads, key_dim, v.shape[-1])  # (B, H, K, V)
    outputs = []
    for t in range(length):
        state = state * g[:, :, t, :, None].exp() + k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, K, V)
        outputs.append((q[:, :, t, :, None] * scale * state).sum(-2))  # (B, H, V)
    return torch.stack(outputs, dim=2).to(dtype)  # (B, H, L, V)
