"""Token-to-token mixing matrices: how much each input token feeds one output token of a mixer, for a given input.

Once the input ``x`` (B, N, C) of a mixer is fixed, every built-in mixer mixes tokens linearly: its output is a
matrix over tokens applied to a per-token quantity, followed by per-token work. Each function below returns that
matrix, and each one's docstring says exactly which part of the mixer it represents (the tests rebuild the
mixer's own output from it):

- ``attention`` (and ``attention_naive``, the same module): ``A_h = softmax(q_h k_h^T * scale)`` per head, with
  ``scale = head_dim ** -0.5`` or 1 ("scale removed"); the mixer returns ``proj(concat_h A_h v_h)``.
- ``swin``: the same softmax with the relative position bias, inside the (shifted) window of the layer, over the
  real tokens of the grid; exactly zero outside the window; the mixer returns ``proj(concat_h A_h v_h)``.
- ``linear``: ``A_h[i, j] = phi(q_i) . phi(k_j) / (phi(q_i) . sum_j phi(k_j) + N eps)``, the mixer's own ``eps``
  included so that ``A_h v_h`` is the mixer's output before ``proj`` to round-off.
- ``mamba``: the selective scan unrolled ("hidden attention", Ali et al. 2024), per direction and scanned channel
  d: ``alpha_d[i, j] = sum_n C_i[n] exp(A_d[n] (S_i - S_j)) delta_j B_j[n]`` for ``j <= i`` in scan order, with
  ``S_i = sum_{s <= i} delta_s``: the scan from its input ``u`` (after the direction's causal conv and silu) to
  its output before the ``D u`` skip and the ``silu(z)`` gate. The backward direction is given in the original
  token order (so it is upper triangular).
- any other registered mixer: the gradient fallback, ``||d y_i / d x_j||_F`` over the (C x C) channel block, the
  effective receptive field of one layer for output token i.

``mixing_rows`` picks the family by class and returns the row of one query token in the shape the app draws.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from mixers import Grid
from mixers.attention import Attention
from mixers.linear import LinearAttention
from mixers.mamba import VimMixer
from mixers.swin import SwinAttention, window_mask

FAMILIES: tuple[str, ...] = ("attention", "swin", "linear", "mamba", "gradient")


@dataclass(frozen=True)
class MixingRows:
    """What one query token hears, as the app draws it.

    Attributes:
        family: how the rows were computed (one of `FAMILIES`).
        rows: (maps, N) float64; ``rows[m, j]``: weight of input token j in the query's output, in map m
            (a head for attention-like mixers; mamba: both directions, forward, backward; gradient: one map).
        map_names: a label for each map, for the head slider.
        note: one line on what the values are.
    """

    family: str
    rows: Tensor
    map_names: tuple[str, ...]
    note: str


def family_of(mixer: nn.Module) -> str:
    """The mixing family of a mixer module; `gradient` for any mixer without an exact map."""
    if isinstance(mixer, SwinAttention):
        return "swin"
    if isinstance(mixer, Attention):
        return "attention"
    if isinstance(mixer, LinearAttention):
        return "linear"
    if isinstance(mixer, VimMixer):
        return "mamba"
    return "gradient"


def attention_matrix(mixer: Attention, x: Tensor, *, scaled: bool = True) -> Tensor:
    """Softmax attention matrices of a global attention mixer.

    Args:
        mixer: an `attention` or `attention_naive` module.
        x: its input tokens (B, N, C).
        scaled: multiply the logits by 1/sqrt(head_dim) as the mixer does; False removes the scale.

    Returns:
        (B, heads, N, N): row i is query token i's softmax over keys; ``A @ v`` is the mixer's output before `proj`.
    """
    q, k, _ = mixer.project_qkv(x)  # (B, heads, N, head_dim)
    scale = mixer.scale if scaled else 1.0
    return ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, heads, N, N)


def swin_window_layout(mixer: SwinAttention, grid: Grid) -> tuple[Tensor, Tensor]:
    """Where each real token of the grid sits among the layer's (shifted, padded) windows.

    Returns:
        window: (N,) index of the window of each token, in row-major order of the padded, rolled grid.
        position: (N,) position of each token inside its window, row-major in ``window_size ** 2``.
    """
    H, W = grid
    ws, s = mixer.window_size, mixer.shift
    Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws
    rows = torch.arange(H)[:, None].expand(H, W).reshape(-1)
    cols = torch.arange(W)[None, :].expand(H, W).reshape(-1)
    # The mixer rolls the padded grid by -shift, so token (r, c) lands at ((r - s) mod Hp, (c - s) mod Wp).
    rr, cc = (rows - s) % Hp, (cols - s) % Wp
    window = (rr // ws) * (Wp // ws) + cc // ws
    position = (rr % ws) * ws + cc % ws
    return window, position


def swin_matrix(mixer: SwinAttention, x: Tensor, grid: Grid, *, scaled: bool = True) -> Tensor:
    """Window attention matrices of a Swin mixer over the real tokens of the grid.

    The logits are those of the mixer (``q k^T * scale`` plus the relative position bias plus the shift mask),
    gathered from window coordinates to token coordinates; pairs in different windows get no weight at all.

    Args:
        mixer: a `swin` module (its `layer_idx` sets the shift).
        x: its input tokens (B, N, C).
        grid: the token grid (H, W).
        scaled: as `attention_matrix`.

    Returns:
        (B, heads, N, N), exactly zero outside each query's window; ``A @ v`` is the mixer's output before `proj`.
    """
    q, k, _ = rearrange(mixer.qkv(x), "b n (three h d) -> three b h n d", three=3, h=mixer.num_heads)
    scale = (mixer.dim // mixer.num_heads) ** -0.5 if scaled else 1.0  # SDPA's default, as the mixer runs it
    window, position = swin_window_layout(mixer, grid)
    window, position = window.to(x.device), position.to(x.device)
    bias = mixer.relative_position_bias()[:, position[:, None], position[None, :]]  # (heads, N, N)
    logits = (q * scale) @ k.transpose(-2, -1) + bias  # (B, heads, N, N)
    allowed = window[:, None] == window[None, :]  # (N, N)
    mask = window_mask(grid, mixer.window_size, mixer.shift, x.device)  # (nW, L, L) or None: pairs the roll brought
    # together from opposite borders, and padding keys (never among the real tokens here)
    if mask is not None:
        allowed = allowed & (mask[window[:, None], position[:, None], position[None, :]] == 0)
    return logits.masked_fill(~allowed, float("-inf")).softmax(dim=-1)  # (B, heads, N, N)


def linear_matrix(mixer: LinearAttention, x: Tensor) -> Tensor:
    """The N x N matrix that non-causal linear attention applies to its values, never formed by the mixer.

    ``A[i, j] = phi(q_i) . phi(k_j) / (phi(q_i) . sum_j phi(k_j) + N eps)``: the mixer computes
    ``phi(q_i) (mean_j phi(k_j)^T v_j) / (phi(q_i) . mean_j phi(k_j) + eps)``, which is this matrix times v.

    Args:
        mixer: a `linear` module.
        x: its input tokens (B, N, C).

    Returns:
        (B, heads, N, N); each row sums to just under 1 (the eps); ``A @ v`` is the mixer's output before `proj`.
    """
    qkv = rearrange(mixer.qkv(x), "b n (three h d) -> three b h n d", three=3, h=mixer.num_heads)
    compute = torch.promote_types(qkv.dtype, torch.float32)  # the mixer's state is float32 (float64 stays)
    q, k = mixer.feature_map(qkv[0].to(compute)), mixer.feature_map(qkv[1].to(compute))  # (B, heads, N, head_dim)
    scores = q @ k.transpose(-2, -1)  # (B, heads, N, N)
    n = x.shape[1]
    return scores / (scores.sum(dim=-1, keepdim=True) + n * mixer.eps)


class ScanDirection(NamedTuple):
    """One direction of a Vim block, unrolled; every tensor in the original token order.

    Attributes:
        matrix: (B, D, L, L) ``alpha_d[i, j]``; lower triangular for the forward direction, upper for the backward.
        u: (B, D, L) the scan's input (after the causal conv and silu).
        skip: (D,) the D skip weights.
        gate: (B, D, L) silu(z), applied after the skip.
    """

    matrix: Tensor
    u: Tensor
    skip: Tensor
    gate: Tensor


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


def _scan_inputs(mixer: VimMixer, x_in: Tensor, conv1d: nn.Conv1d, x_proj: nn.Linear,
                 dt_proj: nn.Linear) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """u, delta (before bias and softplus), B, C of one direction, as `VimMixer._direction` forms them."""
    length = x_in.shape[-1]
    u = F.silu(conv1d(x_in)[..., :length])  # (B, d_inner, L)
    x_dbl = x_proj(rearrange(u, "b d l -> b l d"))  # (B, L, dt_rank + 2 N)
    dt, B, C = torch.split(x_dbl, [mixer.dt_rank, mixer.d_state, mixer.d_state], dim=-1)
    delta = rearrange(F.linear(dt, dt_proj.weight), "b l d -> b d l")  # (B, d_inner, L)
    return u, delta, rearrange(B, "b l n -> b n l"), rearrange(C, "b l n -> b n l")


def mamba_matrices(mixer: VimMixer, x: Tensor) -> tuple[ScanDirection, ScanDirection]:
    """Both directions of a Vim mixer unrolled into hidden-attention matrices.

    The mixer's output is ``out_proj((f.gate * (f.matrix @ f.u + f.skip u_f) + b.gate * (...)) / 2)`` per
    channel, with ``f, b`` the two directions returned here.

    Args:
        mixer: a `mamba` module.
        x: its input tokens (B, N, C).

    Returns:
        (forward, backward) `ScanDirection`s, in float64.
    """
    xz = rearrange(mixer.in_proj(x), "b l d -> b d l")  # (B, 2 d_inner, L)
    x_in, z = xz.chunk(2, dim=1)  # (B, d_inner, L) each
    gate = F.silu(z.double())
    directions = []
    for flip, conv1d, x_proj, dt_proj, A_log, D in (
        (False, mixer.conv1d, mixer.x_proj, mixer.dt_proj, mixer.A_log, mixer.D),
        (True, mixer.conv1d_b, mixer.x_proj_b, mixer.dt_proj_b, mixer.A_b_log, mixer.D_b),
    ):
        seq = x_in.flip(-1) if flip else x_in
        u, delta, B, C = _scan_inputs(mixer, seq, conv1d, x_proj, dt_proj)
        alpha = unrolled_scan(u, delta, -torch.exp(A_log.double()), B, C, dt_proj.bias, delta_softplus=True)
        if flip:  # back to the original token order: row i, column j of the flipped sequence's L-1-i, L-1-j
            alpha, u = alpha.flip(-2, -1), u.flip(-1)
        directions.append(ScanDirection(alpha, u.double(), D.double(), gate))
    return directions[0], directions[1]


def gradient_row(mixer: nn.Module, x: Tensor, grid: Grid, query: int) -> Tensor:
    """The gradient fallback: ``||d y_query / d x_j||_F`` for every input token j (one layer's receptive field).

    Takes one backward pass per output channel of the query token (C of them), which is cheap for one layer at
    the grids the playground draws.

    Args:
        mixer: any token mixer (`forward(x, grid)`).
        x: its input tokens (1, N, C).
        grid: the token grid (H, W).
        query: the output token, row-major index into the grid.

    Returns:
        (N,) non-negative Frobenius norms of the (C x C) Jacobian blocks.
    """
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        out = mixer(x, grid)[0, query]  # (C,)
        squares = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
        for c in range(out.shape[0]):
            (grad,) = torch.autograd.grad(out[c], x, retain_graph=c < out.shape[0] - 1)
            squares += grad[0].double().pow(2).sum(-1)  # (N,)
    return squares.sqrt()


def conv_row(grid: Grid, query: int, kernel_size: int = 3) -> Tensor:
    """The fixed neighbourhood a k x k convolution over the token grid reads for `query`: 1/k^2 inside, 0 out.

    Returns:
        (N,) float64; cropped at the grid's border (zero padding), so a corner token reads 4 of 9 cells.
    """
    H, W = grid
    r, c = divmod(query, W)
    half = kernel_size // 2
    row = torch.zeros(H, W, dtype=torch.float64)
    row[max(r - half, 0):r + half + 1, max(c - half, 0):c + half + 1] = 1.0 / kernel_size**2
    return row.reshape(-1)


def mixing_rows(mixer: nn.Module, x: Tensor, grid: Grid, query: int, *, scaled: bool = True) -> MixingRows:
    """The mixing row of token `query` for any mixer, by its family (see the module docstring).

    Args:
        mixer: a token mixer module.
        x: its input tokens (1, N, C), e.g. the block's norm1 output at one layer.
        grid: the token grid (H, W).
        query: the query (output) token, row-major index into the grid.
        scaled: keep attention's 1/sqrt(head_dim) scale; False removes it (attention and swin only).

    Returns:
        `MixingRows`.
    """
    if x.dim() != 3 or x.shape[0] != 1:
        raise ValueError(f"mixing_rows takes one image's tokens (1, N, C), got {tuple(x.shape)}")
    if not 0 <= query < grid[0] * grid[1]:
        raise ValueError(f"query token {query} is outside the {grid[0]} x {grid[1]} grid")
    family = family_of(mixer)
    scale_note = "" if scaled else ", 1/sqrt(d) scale removed"
    with torch.no_grad():
        if family in ("attention", "swin", "linear"):
            if family == "attention":
                matrix = attention_matrix(mixer, x, scaled=scaled)
                note = f"softmax(q k^T / sqrt(d)) row per head{scale_note}"
            elif family == "swin":
                matrix = swin_matrix(mixer, x, grid, scaled=scaled)
                shifted = f"shifted by {mixer.shift}" if mixer.shift else "not shifted"
                note = f"softmax row inside the {mixer.window_size} x {mixer.window_size} window ({shifted}), zero " \
                       f"outside{scale_note}"
            else:
                matrix = linear_matrix(mixer, x)
                note = "phi(q_i).phi(k_j) / phi(q_i).sum_j phi(k_j), phi = elu + 1 (no scale to remove)"
            rows = matrix[0, :, query].double()  # (heads, N)
            return MixingRows(family, rows, tuple(f"head {h}" for h in range(rows.shape[0])), note)
        if family == "mamba":
            forward, backward = mamba_matrices(mixer, x)
            fwd = forward.matrix[0, :, query].abs().mean(0)  # (N,): mean over the scanned channels
            bwd = backward.matrix[0, :, query].abs().mean(0)  # (N,)
            rows = torch.stack([(fwd + bwd) / 2, fwd, bwd])  # (3, N)
            note = (f"selective scan unrolled, |alpha| averaged over {forward.matrix.shape[1]} channels; without "
                    "the causal conv before it and the D skip and silu(z) gate after it")
            return MixingRows(family, rows, ("both directions", "forward", "backward"), note)
    rows = gradient_row(mixer, x, grid, query)[None]  # (1, N)
    return MixingRows("gradient", rows, ("gradient",), "gradient fallback: ||d y_i / d x_j|| over channels, one layer")
