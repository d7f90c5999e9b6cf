"""The SSD recurrence step by step, as the paper writes it: the independent reference of `chunk_ssd`."""
from __future__ import annotations

import torch
from torch import Tensor


def naive_ssd(x: Tensor, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Causal SSD, one time step at a time.

        h_t = exp(a_t) h_{t-1} + x_t b_t^T    (per head: h (P, N), x_t (P,), b_t (N,))
        y_t = h_t c_t,                        h_0 = 0

    The inputs are already discretised, as in `ssd_minimal_discrete`: `x` is the input times the step size dt and
    `a` is A dt, the log of the per-step decay.

    Args:
        x: inputs (batch, L, H, P).
        a: log decays (batch, L, H), <= 0 for a decaying state.
        b: input maps (batch, L, N), shared by all heads.
        c: output maps (batch, L, N), shared by all heads.

    Returns:
        y (batch, L, H, P) in x's dtype, computed in float64 for float64 inputs and float32 otherwise.
    """
    dtype = x.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    x, a, b, c = (t.to(compute) for t in (x, a, b, c))
    batch, length, heads, head_dim = x.shape
    state = x.new_zeros(batch, heads, head_dim, b.shape[-1])  # (batch, H, P, N)
    outputs = []
    for t in range(length):
        added = x[:, t, :, :, None] * b[:, t, None, None, :]  # (batch, H, P, N)
        state = a[:, t, :, None, None].exp() * state + added
        outputs.append((state * c[:, t, None, None, :]).sum(-1))  # (batch, H, P)
    return torch.stack(outputs, dim=1).to(dtype)  # (batch, L, H, P)
