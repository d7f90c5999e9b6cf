"""Swin (shifted) window attention with a relative position bias, for any token grid.

Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows", ICCV 2021. Tokens attend
only inside non-overlapping `window_size x window_size` windows; odd layers shift the windows by
`window_size // 2` with a cyclic roll and mask the pairs that the roll brought together from opposite borders.

Unlike Swin's `input_resolution`, nothing here is tied to a grid: a grid that the window does not divide is treated
as if padded at the bottom and right (as Swin's detection code and timm's SAM-ViT do) with the padded tokens masked
as keys, which is the same as leaving them out. So they are left out: each window attends over its real tokens
only, and a 4 x 4 grid under a 7 x 7 window costs one 16-token window, not a 49-token one (issue 33). Windows whose
real tokens sit at the same places in the window are batched together. Grid-dependent tensors are cached per grid
and device, outside the state dict.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import trunc_normal_
from torch import Tensor, nn

from .attention import qkv_and_proj, sdpa_backend_name
from .base import Grid, TokenMixer, check_bool_option, check_int_option, check_tokens, grid_cached
from .registry import register_mixer

# Large enough that exp() of it is exactly 0 in fp32/bf16/fp16 next to any sane bias; finite, so that no -inf
# reaches a kernel's arithmetic (every query sees at least itself, so no row is wholly masked). Swin uses -100,
# which a learned bias of a few tens could in principle approach.
MASK_VALUE = -1e4

def relative_position_index(window_size: int, device: torch.device | None = None) -> Tensor:
    """Index into the `((2 * ws - 1) ** 2, heads)` bias table for every (query, key) pair of one window.

    Returns:
        Long tensor of shape `(ws * ws, ws * ws)`; entry `[i, j]` encodes the offset `(dy, dx)` of token i from
        token j as `(dy + ws - 1) * (2 * ws - 1) + (dx + ws - 1)`, the layout of Swin and timm.
    """
    ws = window_size
    coords = torch.stack(torch.meshgrid(torch.arange(ws, device=device), torch.arange(ws, device=device),
                                        indexing="ij")).flatten(1)  # (2, L)
    rel = coords[:, :, None] - coords[:, None, :]  # (2, L, L)
    return (rel[0] + ws - 1) * (2 * ws - 1) + (rel[1] + ws - 1)  # (L, L)


class WindowGroup(NamedTuple):
    """Windows whose real tokens sit at the same places inside the window."""

    tokens: Tensor  # (windows, L): row-major index in the grid of each window's real tokens
    bias_index: Tensor  # (L, L): into the bias table, as `relative_position_index` for these places
    mask: Tensor | None  # (windows, L, L): MASK_VALUE between shift regions; None where no window has two


def _axis_windows(size: int, window_size: int, shift: int) -> dict[tuple, list[tuple[list[int], list[int]]]]:
    """One axis of the padded, rolled grid: its windows grouped by where their real rows (columns) sit.

    Returns:
        `{places: [(rows, regions) of each window]}`: `places` are the real rows' positions inside the window;
        each window's `rows` are their coordinates in the grid, `regions` their shift-region labels.
    """
    ws = window_size
    padded = math.ceil(size / ws) * ws
    kinds: dict[tuple, list[tuple[list[int], list[int]]]] = {}
    for start in range(0, padded, ws):
        rows = [(p, (p + shift) % padded) for p in range(start, start + ws)]  # rolled place, grid row
        rows = [(p, r) for p, r in rows if r < size]  # the padded rows are left out
        if not rows:
            continue
        # Shift regions as Swin labels them: the last window of a shifted layer holds the rows that wrapped
        # around (2) next to the ones that did not (1).
        regions = [0 if not shift or p < padded - ws else (1 if p < padded - shift else 2) for p, _ in rows]
        kinds.setdefault(tuple(p - start for p, _ in rows), []).append(([r for _, r in rows], regions))
    return kinds


def window_groups(grid: Grid, window_size: int, shift: int,
                  device: torch.device | None = None) -> tuple[list[WindowGroup], Tensor]:
    """The windows of the padded, rolled grid as groups of like windows, over real tokens only.

    Every real token lies in exactly one window of one group; padded tokens lie in none (as keys they would be
    masked, as queries cropped, so leaving them out changes no output). A grid the window divides is one group,
    shifted or not, as in Swin; on one it does not divide, each axis has up to two kinds of window (three when
    shifted: the padding can fall inside a window), so up to four groups (nine).

    Returns:
        The groups, and `order` `(H * W,)`: where each token's output lies in the groups' outputs concatenated
        (window by window, token by token).
    """
    H, W = grid
    ws = window_size
    index = relative_position_index(ws, device)  # (ws * ws, ws * ws)
    groups = []
    for row_places, row_windows in _axis_windows(H, ws, shift).items():
        for col_places, col_windows in _axis_windows(W, ws, shift).items():
            n_windows = len(row_windows) * len(col_windows)
            rows, row_regions = (torch.tensor(list(t), device=device) for t in zip(*row_windows))  # (row w., r)
            cols, col_regions = (torch.tensor(list(t), device=device) for t in zip(*col_windows))  # (col w., c)
            tokens = (rows[:, None, :, None] * W + cols[None, :, None, :]).reshape(n_windows, -1)  # (windows, L)
            places = (torch.tensor(row_places, device=device)[:, None] * ws
                      + torch.tensor(col_places, device=device)[None, :]).flatten()  # (L,)
            mask = None
            if any(len(set(r)) > 1 for _, r in row_windows) or any(len(set(c)) > 1 for _, c in col_windows):
                region = (row_regions[:, None, :, None] * 3 + col_regions[None, :, None, :]).reshape(n_windows, -1)
                blocked = region[:, :, None] != region[:, None, :]  # (windows, L, L)
                mask = torch.zeros(blocked.shape, device=device).masked_fill(blocked, MASK_VALUE)
            groups.append(WindowGroup(tokens, index[places[:, None], places[None, :]], mask))
    order = torch.argsort(torch.cat([g.tokens.flatten() for g in groups]))  # (H * W,)
    return groups, order


@register_mixer("swin")
class SwinAttention(TokenMixer):
    """Window multi-head self-attention with relative position bias; odd layers use shifted windows.

    Parameters carry timm's `WindowAttention` names (`qkv`, `proj`, `relative_position_bias_table`), so weights
    copy between the two. Attention runs through `F.scaled_dot_product_attention` with the float mask
    `bias + mask`, which on CUDA selects the memory-efficient kernel (it accepts an arbitrary bias with a
    gradient); `impl` records the backend that PyTorch picked.

    Each window attends over its real tokens only (`window_groups`): the outputs are those of Swin's padded grid
    with the padded keys masked, and no work is spent on padding, neither in the projections nor in attention.
    Like windows run as one batch: a grid the window divides runs one SDPA call, as Swin's; one it does not, a few
    (`window_groups`).
    """

    def __init__(self, dim: int, num_heads: int, *, layer_idx: int = 0, window_size: int = 7,
                 qkv_bias: bool = True) -> None:
        """
        Args:
            dim: channels C of the tokens; `num_heads` must divide it.
            num_heads: attention heads.
            layer_idx: depth of the block; odd layers shift the windows by `window_size // 2`.
            window_size: side of the square attention window, in tokens.
            qkv_bias: learn a bias in the q, k, v projection.
        """
        super().__init__()
        # Types and ranges first (issue 35): a TOML `true` or a 0 would otherwise build a degenerate mixer.
        check_int_option("swin", "window_size", window_size)
        check_bool_option("swin", "qkv_bias", qkv_bias)
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}")
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        self.dim = dim
        self.num_heads = num_heads
        self.layer_idx = layer_idx
        self.window_size = window_size
        self.shift = window_size // 2 if layer_idx % 2 else 0
        self.qkv, self.proj = qkv_and_proj(dim, qkv_bias)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        trunc_normal_(self.relative_position_bias_table, std=0.02)
        # Plain dict, not buffers: these are functions of (grid, device), so they stay out of the state dict and
        # any grid works after loading a checkpoint.
        self._cache: dict[tuple, Tensor | None] = {}

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, shift={self.shift}"

    def _groups(self, grid: Grid, device: torch.device) -> tuple[list[WindowGroup], Tensor]:
        return grid_cached(self._cache, ("groups", grid, device),
                           lambda: window_groups(grid, self.window_size, self.shift, device))

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """Attends inside (shifted) windows of the grid.

        Args:
            x: tokens `(B, H * W, C)` in row-major order of `grid`.
            grid: the token grid `(H, W)`.

        Returns:
            Tokens of the same shape as `x`.
        """
        check_tokens(x, grid)
        h = self.num_heads
        groups, order = self._groups(grid, x.device)
        qkv = self.qkv(x)  # (B, N, 3C)
        outs, labelled = [], None
        for group in groups:
            n_windows, L = group.tokens.shape
            windows = qkv.index_select(1, group.tokens.flatten())  # (B, nW * L, 3C), window by window
            # Windows and heads share one axis so that the bias (and shift mask) broadcasts over the batch and
            # SDPA gets 4-D inputs (which its fused kernels need).
            q, k, v = rearrange(windows, "b (nw l) (three h d) -> three b (nw h) l d",
                                nw=n_windows, three=3, h=h)  # 3 x (B, nW * heads, L, head_dim)
            bias = rearrange(self.relative_position_bias_table[group.bias_index], "i j h -> h i j")  # (h, L, L)
            if group.mask is None:
                attn_mask = bias.expand(n_windows, -1, -1, -1)  # (nW, h, L, L)
            else:
                attn_mask = bias.unsqueeze(0) + group.mask.unsqueeze(1)  # (nW, h, L, L)
            attn_mask = attn_mask.reshape(n_windows * h, L, L).to(q.dtype)  # (nW * h, L, L)
            labelled = labelled or (q, k, v, attn_mask)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, nW * heads, L, head_dim)
            outs.append(rearrange(out, "b (nw h) l d -> b (nw l) (h d)", nw=n_windows, h=h))  # (B, nW * L, C)
        # Labelled after the loop, by the first group's call: the backend query is a graph break under
        # torch.compile, and one inside the loop would send the whole forward back to eager.
        self.impl = sdpa_backend_name(*labelled)
        out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]  # (B, N, C), in the groups' order
        return self.proj(out.index_select(1, order))  # (B, N, C), in the grid's order

    def macs(self, grid: Grid) -> int:
        """Forward multiply-accumulates for one image on `grid`.

        Counts the q, k, v and output projections, and `Q K^T` and `A V` over every pair of real tokens that share
        a window (pairs in different shift regions are computed, then masked). The bias gather, mask add and
        softmax are not counted (the repository's convention for element-wise work).
        """
        n = grid[0] * grid[1]
        projections = n * self.dim * 3 * self.dim + n * self.dim * self.dim
        return projections + 2 * self.window_pairs(grid) * self.dim  # QK^T and AV: C per pair each

    def window_pairs(self, grid: Grid) -> int:
        """(query, key) pairs of real tokens that share a window: the size of the scores this layer computes."""
        def squares(size: int) -> int:  # sum over one axis's windows of (real rows in the window)^2
            windows = _axis_windows(size, self.window_size, self.shift)
            return sum(len(places) ** 2 * len(of_kind) for places, of_kind in windows.items())

        # A window with r real rows and c real columns holds (r c)^2 pairs, so the sum factors over the axes.
        return squares(grid[0]) * squares(grid[1])
