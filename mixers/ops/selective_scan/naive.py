"""The selective scan as the paper writes it: a float64 reference loop (the tests' independent reference) and a
loop that autograd differentiates (`torch_loop`).

    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t        (per channel d, per state n)
    y_t = (sum_n C_t[n] * h_t[n] + D * u_t) * silu(z_t)

Shapes follow mamba-ssm's `selective_scan_fn`: `u, delta, z: (B, D, L)`, `A: (D, N)` real, `B, C: (B, N, L)`,
`D, delta_bias: (D,)`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from ..precision import compute_dtype


def grouped(t: Tensor) -> Tensor:
    """B or C as (B, G, N, L): one group when given as (B, N, L).

    With G groups, channel d reads group d // (D / G) (mamba-ssm's "variable B" groups): vmamba scans its four
    directions in one call so, each direction's channels reading its own B and C.
    """
    return t[:, None] if t.dim() == 3 else t  # (B, G, N, L)


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
        B: input projections (B, N, L), or (B, G, N, L) for G channel groups (see `grouped`).
        C: output projections, shaped as B.
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
    per_group = channels // grouped(B).shape[1]
    B, C = (grouped(t).repeat_interleave(per_group, dim=1) for t in (B, C))  # (B, D or 1, N, L)
    h = u.new_zeros(batch, channels, A.shape[1])  # (B, D, N)
    ys = [u.new_empty(0)] * length
    for t in reversed(range(length)) if reverse else range(length):
        dt = delta[:, :, t, None]  # (B, D, 1)
        h = torch.exp(dt * A) * h + dt * B[..., t] * u[:, :, t, None]  # (B, D, N)
        ys[t] = (h * C[..., t]).sum(-1)  # (B, D)
    y = torch.stack(ys, dim=-1)  # (B, D, L)
    if D is not None:
        y = y + D.double()[:, None] * u
    if z is not None:
        y = y * F.silu(z.double())
    return y


def effective_delta(delta: Tensor, delta_bias: Tensor | None, delta_softplus: bool, dtype: torch.dtype) -> Tensor:
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
    ct = compute_dtype(u)
    uc, A_, Bc, Cc = u.to(ct), A.to(ct), B.to(ct), C.to(ct)
    dt = effective_delta(delta, delta_bias, delta_softplus, ct)
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

