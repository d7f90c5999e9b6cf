"""The linear recurrences among the mixers (mamba, vmamba, gla, mamba2) unrolled into token-to-token matrices.

Once the input of such a mixer is fixed, its recurrence maps a per-token quantity to a per-token output through a
lower-triangular matrix in scan order (Ali et al. 2024, "The Hidden Attention of Mamba Models"; GLA's parallel
form, Yang et al. 2024). Each function below returns those matrices in the original token order, together with
what they are applied to, so the tests rebuild each mixer's own output from them:

- ``mamba`` (Vim): per direction and scanned channel d, ``alpha_d[i, j] = sum_n C_i[n] exp(A_d[n] (S_i - S_j))
  delta_j B_j[n]`` for ``j <= i`` in scan order, ``S_i = sum_{s <= i} delta_s``, applied to the scan input ``u``
  (after the direction's causal conv and silu); the ``D u`` skip and ``silu(z)`` gate come after.
- ``vmamba`` (SS2D): the same unrolled scan for each of its four scan orders (row-major, column-major and both
  reversed), applied to ``u`` after the depthwise 3 x 3 conv and silu; the four are summed (the cross-merge), then
  ``out_norm`` and the ``silu(z)`` gate.
- ``gla`` (BiGLA): per head and direction ``A[t, s] = scale * sum_k q_t[k] k_s[k] exp(G_t[k] - G_s[k])`` for
  ``s <= t`` in scan order, ``G = cumsum(log forget gate)``, applied to ``v``; the directions are summed, then
  the per-head RMSNorm, the swish output gate and ``o_proj``.
- ``mamba2`` (Hydra on SSD): per head, Hydra's quasiseparable matrix (`mixers.ops.ssd.hydra_matrix`): the forward
  SSD shifted one token below the diagonal, the backward one shifted one token above it, ``fc_D(u) + D`` on it;
  applied to ``u`` (after the centred depthwise conv and silu), the same weight for every channel of the head;
  then the RMSNorm over the inner width, the ``silu(z)`` gate and ``out_proj``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from mixers import Grid
from mixers.gla import BiGLA
from mixers.mamba import VimMixer
from mixers.mamba2 import HydraMixer
from mixers.ops.ssd import HydraMatrix, hydra_matrix
from mixers.vmamba import SS2D, cross_scan

VMAMBA_SCANS: tuple[str, ...] = ("row-major scan", "column-major scan", "row-major reversed", "column-major reversed")
MAMBA2_PARTS: tuple[str, ...] = ("forward + backward + diagonal", "forward", "backward", "diagonal")


class ScanDirection(NamedTuple):
    """One scan direction unrolled; every tensor in the original token order.

    Attributes:
        matrix: (B, D, L, L) ``alpha_d[i, j]``; lower triangular in the direction's own scan order.
        u: (B, D, L) the scan's input.
        skip: (D,) the D skip weights.
        gate: (B, D, L) silu(z) applied after the skip (mamba), or None where the gate comes after a norm (vmamba).
    """

    matrix: Tensor
    u: Tensor
    skip: Tensor
    gate: Tensor | None


def unrolled_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, delta_bias: Tensor | None = None,
                  delta_softplus: bool = True) -> Tensor:
    """The selective scan as a matrix per channel: ``y_core[:, d] = alpha_d @ u[:, d]``, in float64.

    Arguments as `mixers.ops.selective_scan.selective_scan_reference`, whose output without ``D`` and ``z`` is
    ``einsum("bdij,bdj->bdi", alpha, u)``.

    Returns:
        alpha (B, D, L, L), lower triangular.
    """
    delta = delta.double()
    if delta_bias is not None:
        delta = delta + delta_bias.double()[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    A, B, C = A.double(), B.double(), C.double()
    S = delta.cumsum(-1)  # (B, D, L)
    length = u.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=u.device).tril()  # (L, L): j <= i
    # S_i - S_j >= 0 where j <= i, so A (S_i - S_j) <= 0 and exp never overflows; j > i is zeroed below.
    elapsed = (S[..., :, None] - S[..., None, :]).clamp(min=0)  # (B, D, L, L)
    alpha = torch.zeros_like(elapsed)
    for n in range(A.shape[1]):  # one state at a time: a (B, D, L, L, N) tensor would not fit at larger grids
        drive = delta * B[:, None, n, :]  # (B, D, L): delta_j B_j[n]
        alpha += C[:, None, n, :, None] * torch.exp(A[None, :, n, None, None] * elapsed) * drive[..., None, :]
    return alpha * causal


class _ScanInputs(NamedTuple):
    """One direction's scan, in its own scan order: everything `unrolled_scan` takes, and the skip."""

    u: Tensor  # (B, D, L)
    delta: Tensor  # (B, D, L), before the bias and softplus
    A: Tensor  # (D, N)
    B: Tensor  # (B, N, L)
    C: Tensor  # (B, N, L)
    delta_bias: Tensor  # (D,)
    skip: Tensor  # (D,)

    def unroll(self) -> Tensor:
        """alpha (B, D, L, L), in scan order."""
        return unrolled_scan(self.u, self.delta, self.A, self.B, self.C, self.delta_bias, delta_softplus=True)

    def mean_abs_row(self, step: int) -> Tensor:
        """(B, L) ``mean_d |alpha_d[step, :]|`` in scan order: one row of the unrolled scan, never the whole matrix
        (a (D, L, L) block per click would cost N times more; a row is (D, N, L))."""
        delta = F.softplus(self.delta.double() + self.delta_bias.double()[:, None])  # (B, D, L)
        S = delta.cumsum(-1)  # (B, D, L)
        length = S.shape[-1]
        # S_step - S_j >= 0 where j <= step, so A (S_step - S_j) <= 0 and exp never overflows; j > step is zeroed.
        elapsed = (S[..., step:step + 1] - S).clamp(min=0)  # (B, D, L)
        decay = torch.exp(self.A.double()[None, :, :, None] * elapsed[:, :, None, :])  # (B, D, N, L)
        drive = delta[:, :, None, :] * self.B.double()[:, None]  # (B, D, N, L): delta_j B_j[n]
        row = torch.einsum("bn,bdnj->bdj", self.C.double()[:, :, step], decay * drive)  # (B, D, L)
        causal = torch.arange(length, device=S.device) <= step  # (L,)
        return row.abs().mean(1) * causal


def _mamba_scans(mixer: VimMixer, x: Tensor) -> tuple[list[_ScanInputs], Tensor]:
    """Both directions' scan inputs of a Vim mixer (the backward one in flipped order), and silu(z) (B, D, L)."""
    xz = rearrange(mixer.in_proj(x), "b l d -> b d l")  # (B, 2 d_inner, L)
    x_in, z = xz.chunk(2, dim=1)  # (B, d_inner, L) each
    scans = []
    for flip, conv1d, x_proj, dt_proj, A_log, D in (
        (False, mixer.conv1d, mixer.x_proj, mixer.dt_proj, mixer.A_log, mixer.D),
        (True, mixer.conv1d_b, mixer.x_proj_b, mixer.dt_proj_b, mixer.A_b_log, mixer.D_b),
    ):
        seq = x_in.flip(-1) if flip else x_in
        length = seq.shape[-1]
        u = F.silu(conv1d(seq)[..., :length])  # (B, d_inner, L)
        x_dbl = x_proj(rearrange(u, "b d l -> b l d"))  # (B, L, dt_rank + 2 N)
        dt, B, C = torch.split(x_dbl, [mixer.dt_rank, mixer.d_state, mixer.d_state], dim=-1)
        delta = rearrange(F.linear(dt, dt_proj.weight), "b l d -> b d l")  # (B, d_inner, L)
        scans.append(_ScanInputs(u, delta, -torch.exp(A_log.double()), rearrange(B, "b l n -> b n l"),
                                 rearrange(C, "b l n -> b n l"), dt_proj.bias, D))
    return scans, F.silu(z.double())


def mamba_matrices(mixer: VimMixer, x: Tensor) -> tuple[ScanDirection, ScanDirection]:
    """Both directions of a Vim mixer unrolled into hidden-attention matrices.

    The mixer's output is ``out_proj((f.gate * (f.matrix @ f.u + f.skip u_f) + b.gate * (...)) / 2)`` per
    channel, with ``f, b`` the two directions returned here.

    Args:
        mixer: a `mamba` module.
        x: its input tokens (B, N, C).

    Returns:
        (forward, backward) `ScanDirection`s in float64; the backward matrix is upper triangular in token order.
    """
    scans, gate = _mamba_scans(mixer, x)
    directions = []
    for flip, scan in zip((False, True), scans):
        alpha, u = scan.unroll(), scan.u
        if flip:  # back to the original token order: row i, column j of the flipped sequence's L-1-i, L-1-j
            alpha, u = alpha.flip(-2, -1), u.flip(-1)
        directions.append(ScanDirection(alpha, u.double(), scan.skip.double(), gate))
    return directions[0], directions[1]


def mamba_map_rows(mixer: VimMixer, x: Tensor) -> Callable[[int], Tensor]:
    """Query -> (3, N) ``mean_d |alpha_d[query, :]|``: both directions averaged (as the mixer averages them),
    forward, backward; in token order. The scan inputs are computed once, each call unrolls one row."""
    scans, _ = _mamba_scans(mixer, x)
    length = x.shape[1]

    def rows(query: int) -> Tensor:
        forward = scans[0].mean_abs_row(query)[0]  # (N,)
        backward = scans[1].mean_abs_row(length - 1 - query)[0].flip(-1)  # (N,), back to token order
        return torch.stack([(forward + backward) / 2, forward, backward])

    return rows


def _scan_order(grid: Grid, device: torch.device) -> list[Tensor]:
    """For each of vmamba's scans, the row-major token index at each step of the scan, (L,) each."""
    H, W = grid
    tokens = torch.arange(H * W, device=device).view(1, 1, H, W)  # (1, 1, H, W)
    return [order[0, 0] for order in cross_scan(tokens)]


def _vmamba_scans(mixer: SS2D, x: Tensor, grid: Grid) -> tuple[list[_ScanInputs], Tensor, Tensor]:
    """vmamba's four scans' inputs (each in its scan order), z (B, L, d_inner) and u in token order (B, D, L)."""
    H, W = grid
    u, z = mixer.in_proj(x).chunk(2, dim=-1)  # (B, L, d_inner) each
    u = F.silu(mixer.conv2d(rearrange(u, "b (h w) d -> b d h w", h=H, w=W)))  # (B, d_inner, H, W)
    d, n, r = mixer.d_inner, mixer.d_state, mixer.dt_rank
    scans = []
    for k, seq in enumerate(cross_scan(u)):  # (B, d_inner, L) in scan k's order
        x_dbl = F.linear(rearrange(seq, "b d l -> b l d"), mixer.x_proj_weight[k])  # (B, L, r + 2N)
        dt, B, C = torch.split(x_dbl, [r, n, n], dim=-1)
        delta = rearrange(F.linear(dt, mixer.dt_projs_weight[k]), "b l d -> b d l")  # (B, d_inner, L)
        scans.append(_ScanInputs(seq, delta, -torch.exp(mixer.A_logs[k * d:(k + 1) * d].double()),
                                 rearrange(B, "b l n -> b n l"), rearrange(C, "b l n -> b n l"),
                                 mixer.dt_projs_bias[k], mixer.Ds[k * d:(k + 1) * d]))
    return scans, z, u.flatten(2)


def _to_token_order(matrix: Tensor, order: Tensor) -> Tensor:
    """A (..., L, L) matrix over scan steps as one over tokens: entry (order[i], order[j]) = matrix[i, j]."""
    out = torch.empty_like(matrix)
    out[..., order[:, None], order[None, :]] = matrix
    return out


def vmamba_matrices(mixer: SS2D, x: Tensor, grid: Grid) -> tuple[list[ScanDirection], Tensor]:
    """vmamba's four scans unrolled, each in token order.

    The mixer's output is ``out_proj(out_norm(sum_k (m_k.matrix @ u + m_k.skip u)) * silu(z))`` per channel, with
    ``u`` each direction's `u` (the same tokens, after the depthwise conv and silu).

    Args:
        mixer: a `vmamba` module.
        x: its input tokens (B, N, C).
        grid: the token grid (H, W).

    Returns:
        (four `ScanDirection`s in the order of `VMAMBA_SCANS`, with ``gate=None``; z (B, N, d_inner)).
    """
    scans, z, u = _vmamba_scans(mixer, x, grid)
    directions = [ScanDirection(_to_token_order(scan.unroll(), order), u.double(), scan.skip.double(), None)
                  for scan, order in zip(scans, _scan_order(grid, x.device))]
    return directions, z


def vmamba_map_rows(mixer: SS2D, x: Tensor, grid: Grid) -> Callable[[int], Tensor]:
    """Query -> (5, N) in token order: the four scans' ``mean_d |alpha_d[query, :]|`` summed (the cross-merge sums
    them), then each scan. The scan inputs are computed once, each call unrolls one row of each scan."""
    scans, _, _ = _vmamba_scans(mixer, x, grid)
    orders = _scan_order(grid, x.device)
    steps = [torch.argsort(order) for order in orders]  # token -> its step in each scan

    def rows(query: int) -> Tensor:
        each = torch.zeros(len(scans), x.shape[1], dtype=torch.float64, device=x.device)  # (4, N)
        for k, (scan, order, step) in enumerate(zip(scans, orders, steps)):
            each[k, order] = scan.mean_abs_row(int(step[query]))[0]
        return torch.cat([each.sum(0, keepdim=True), each])

    return rows


def _gla_causal(q: Tensor, k: Tensor, g: Tensor, scale: float) -> Tensor:
    """``A[t, s] = scale * sum_k q_t[k] k_s[k] exp(G_t[k] - G_s[k])`` for s <= t, else 0; (B, H, L, L) float64."""
    q, k, G = q.double(), k.double(), g.double().cumsum(2)  # (B, H, L, K)
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()  # (L, L): s <= t
    # G_t - G_s <= 0 where s <= t (log gates <= 0), so exp never overflows; s > t is zeroed below.
    decay = (G[:, :, :, None, :] - G[:, :, None, :, :]).clamp(max=0).exp()  # (B, H, L, L, K)
    return scale * torch.einsum("bhtk,bhsk,bhtsk->bhts", q, k, decay) * causal


def _gla_inputs(mixer: BiGLA, x: Tensor) -> tuple[Tensor, Tensor, Tensor, list[Tensor], float]:
    """q, k (B, H, L, K), v (B, H, L, V), both directions' log forget gates and the scale, as `BiGLA` forms them."""
    heads = mixer.num_heads
    q, k, v = (rearrange(p(x), "b l (h d) -> b h l d", h=heads) for p in (mixer.q_proj, mixer.k_proj, mixer.v_proj))
    gates = [rearrange(F.logsigmoid(p(x).double()) / mixer.gate_logit_normalizer, "b l (h d) -> b h l d", h=heads)
             for p in mixer.gk_proj]  # 2 x (B, H, L, K), log decays <= 0
    return q, k, v, gates, mixer.head_k_dim**-0.5  # chunk_gla's default scale, as the mixer runs it


def gla_matrices(mixer: BiGLA, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Both directions of a BiGLA mixer as matrices over tokens, per head.

    The mixer's output is ``o_proj(rmsnorm_h((F + B) @ v) * silu(g_proj(x)))``, the RMSNorm per head and token.

    Args:
        mixer: a `gla` module.
        x: its input tokens (B, N, C).

    Returns:
        forward (B, heads, N, N) lower triangular, backward (B, heads, N, N) upper triangular, v
        (B, heads, N, head_v_dim) in float64.
    """
    q, k, v, gates, scale = _gla_inputs(mixer, x)
    forward = _gla_causal(q, k, gates[0], scale)
    backward = _gla_causal(q.flip(2), k.flip(2), gates[1].flip(2), scale).flip(-2, -1)
    return forward, backward, v.double()


def _gla_row(q: Tensor, k: Tensor, g: Tensor, scale: float, step: int) -> Tensor:
    """Row `step` of `_gla_causal`'s matrix, (B, H, L) float64, in the scan order of its inputs."""
    q, k, G = q.double(), k.double(), g.double().cumsum(2)  # (B, H, L, K)
    decay = (G[:, :, step:step + 1] - G).clamp(max=0).exp()  # (B, H, L, K): exp(G_step - G_s)
    row = scale * torch.einsum("bhk,bhsk->bhs", q[:, :, step], k * decay)  # (B, H, L)
    return row * (torch.arange(q.shape[2], device=q.device) <= step)


def gla_map_rows(mixer: BiGLA, x: Tensor) -> Callable[[int], Tensor]:
    """Query -> (heads, 3, N): per head ``|F + B|`` (the mixer sums its directions), ``|F|``, ``|B|``, one row of
    `gla_matrices`' matrices; the projections are computed once, each call forms one row."""
    q, k, _, gates, scale = _gla_inputs(mixer, x)
    flipped = [t.flip(2) for t in (q, k, gates[1])]
    length = x.shape[1]

    def rows(query: int) -> Tensor:
        forward = _gla_row(q, k, gates[0], scale, query)[0]  # (H, N)
        backward = _gla_row(*flipped, scale, length - 1 - query)[0].flip(-1)  # (H, N), back to token order
        return torch.stack([(forward + backward).abs(), forward.abs(), backward.abs()], dim=1)

    return rows


def mamba2_matrices(mixer: HydraMixer, x: Tensor) -> tuple[HydraMatrix, Tensor]:
    """A Hydra mixer's quasiseparable matrix per head, in its three parts, and what it is applied to.

    The mixer's output is ``out_proj(rmsnorm(concat_h (Q_h @ u_h)) * silu(z))`` with ``Q = parts.whole()``, the
    RMSNorm over the inner width (all heads together).

    Args:
        mixer: a `mamba2` module.
        x: its input tokens (B, N, C).

    Returns:
        (`HydraMatrix` in float64, forward and backward (B, heads, N, N), diagonal (B, heads, N); u (B, heads, N,
        headdim) float64, the conv's output split into heads).
    """
    d_inner, n, heads = mixer.d_inner, mixer.d_state, mixer.nheads
    _, xbc, dt = torch.split(mixer.in_proj(x), [d_inner, d_inner + 4 * n, 2 * heads], dim=-1)
    xbc = rearrange(F.silu(mixer.conv1d(rearrange(xbc, "b l d -> b d l"))), "b d l -> b l d").double()
    u, b_fwd, c_fwd, b_bwd, c_bwd = torch.split(xbc, [d_inner, n, n, n, n], dim=-1)  # (B, L, d_inner), (B, L, N)
    dt_fwd, dt_bwd = (F.softplus(d.double() + mixer.dt_bias.double()) for d in dt.chunk(2, dim=-1))  # (B, L, heads)
    diagonal = F.linear(u, mixer.fc_D.weight.double(), mixer.D.double())  # (B, L, heads)
    parts = hydra_matrix(-torch.exp(mixer.A_log.double()), diagonal, dt_fwd, b_fwd, c_fwd, dt_bwd, b_bwd, c_bwd)
    return parts, rearrange(u, "b l (h p) -> b h l p", h=heads)  # u: (B, heads, L, headdim)


def mamba2_map_rows(mixer: HydraMixer, x: Tensor) -> Callable[[int], Tensor]:
    """Query -> (heads, 4, N): per head ``|Q|`` (the three parts together, as the mixer applies them), then the
    forward, backward and diagonal parts alone (`MAMBA2_PARTS`), one row of `mamba2_matrices`' matrices. The whole
    matrices are formed once (heads x N^2 entries, as attention's), each call reads a row."""
    parts, _ = mamba2_matrices(mixer, x)
    each = torch.stack([parts.forward[0], parts.backward[0], torch.diag_embed(parts.diagonal[0])], dim=1)
    maps = torch.cat([each.sum(1, keepdim=True), each], dim=1).abs()  # (heads, 4, N, N)
    return lambda query: maps[:, :, query]


def is_recurrence(mixer: nn.Module) -> bool:
    """Whether `mixer` is one of the recurrences this module unrolls."""
    return isinstance(mixer, (VimMixer, SS2D, BiGLA, HydraMixer))
