"""The SSD written out as one matrix over the whole sequence, and Hydra's quasiseparable matrix built from two of
them: what the mixers mix tokens with, formed explicitly to be read (the playground's mixing maps) or checked (the
tests), never to run a mixer (it costs L^2 per head, where `chunk_ssd` costs L times a chunk).

With one chunk as long as the sequence, `chunk_ssd`'s dual form is the whole computation:
`naive_ssd(x, a, b, c)[:, i, h] = sum_j M[:, h, i, j] x[:, j, h]` with `M[h, i, j] = (c_i . b_j) exp(a_{j+1} + ... +
a_i)` for j <= i and 0 above the diagonal (`ssd_matrix`).

Hydra (Hwang et al. 2024, as `mixers/mamba2.py` runs it) mixes the per-head input u with
`Q = shift_down(M_fwd) + shift_up(M_bwd) + diag(d)`: below the diagonal the forward SSD, read one token late
(`Q[t, s] = (c_{t-1} . b_s) exp(a_{s+1} + ... + a_{t-1}) dt_s`, s < t); above it the backward SSD of the reversed
sequence, read one token early (`Q[t, s] = (c_{t+1} . b_s) exp(a_{t+1} + ... + a_{s-1}) dt_s`, s > t), each with
its own maps and steps; on it a free weight per token and head (`hydra_matrix`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from .chunk import segsum


def ssd_matrix(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """The causal SSD as one lower-triangular matrix per head, on the inputs `naive_ssd` takes (x aside).

    Args:
        a: log decays A dt (batch, L, H), <= 0.
        b: input maps (batch, L, N), shared by all heads.
        c: output maps (batch, L, N), shared by all heads.

    Returns:
        M (batch, H, L, L) with `naive_ssd(x, a, b, c) == einsum("zhij,zjhp->zihp", M, x)`; zero above the diagonal.
    """
    decay = segsum(rearrange(a, "z l h -> z h l")).exp()  # (batch, H, L_i, L_j), zero above the diagonal
    scores = c @ b.transpose(-1, -2)  # (batch, L_i, L_j): c_i . b_j, one for all heads
    return decay * scores[:, None]


class HydraMatrix(NamedTuple):
    """Hydra's quasiseparable matrix in its three parts, per head, over the per-head input u.

    Attributes:
        forward: (batch, H, L, L) the forward SSD shifted one token down: strictly lower triangular.
        backward: (batch, H, L, L) the backward SSD shifted one token up: strictly upper triangular.
        diagonal: (batch, H, L) each token's weight on its own u.
    """

    forward: Tensor
    backward: Tensor
    diagonal: Tensor

    def whole(self) -> Tensor:
        """(batch, H, L, L) the sum of the three parts: the matrix the mixer applies to u, head by head."""
        return self.forward + self.backward + torch.diag_embed(self.diagonal)


def hydra_matrix(A: Tensor, diagonal: Tensor, dt_fwd: Tensor, b_fwd: Tensor, c_fwd: Tensor, dt_bwd: Tensor,
                 b_bwd: Tensor, c_bwd: Tensor) -> HydraMatrix:
    """Hydra's mixing matrix over u from the discretisation's inputs, each in the original token order.

    Each direction's SSD runs on x = u dt with log decays A dt, so its matrix over u is `ssd_matrix` with column s
    times dt_s; the backward one is the forward SSD of the reversed sequence, reversed back (upper triangular).
    The one-token shifts leave the diagonal to `diagonal` alone.

    Args:
        A: (H,) the decay rates, < 0, shared by the directions.
        diagonal: (batch, L, H) the weight of each token's own u (Hydra's fc_D(u) + D).
        dt_fwd: (batch, L, H) the forward direction's step sizes, after softplus.
        b_fwd: (batch, L, N) its input maps.
        c_fwd: (batch, L, N) its output maps.
        dt_bwd: (batch, L, H) the backward direction's step sizes, in token order.
        b_bwd: (batch, L, N) its input maps, in token order.
        c_bwd: (batch, L, N) its output maps, in token order.

    Returns:
        `HydraMatrix`; `whole() @ u` per head (u as (batch, H, L, P)) is the mixer's output before its norm.
    """
    on_u = rearrange(dt_fwd, "z l h -> z h 1 l")  # (batch, H, 1, L_s): column s times dt_s
    forward = ssd_matrix(dt_fwd * A, b_fwd, c_fwd) * on_u  # (batch, H, L, L)
    reversed_maps = (t.flip(1) for t in (dt_bwd * A, b_bwd, c_bwd))
    backward = ssd_matrix(*reversed_maps).flip(-2, -1) * rearrange(dt_bwd, "z l h -> z h 1 l")  # (batch, H, L, L)
    # Row t reads the forward SSD at t - 1 and the backward at t + 1; the first (last) row reads nothing.
    forward = F.pad(forward[..., :-1, :], (0, 0, 1, 0))  # (batch, H, L, L), strictly lower
    backward = F.pad(backward[..., 1:, :], (0, 0, 0, 1))  # (batch, H, L, L), strictly upper
    return HydraMatrix(forward, backward, rearrange(diagonal, "z l h -> z h l"))
