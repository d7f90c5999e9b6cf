"""Swin (shifted) window attention with a relative position bias, for any token grid.

Liu et al., "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows", ICCV 2021. Tokens attend
only inside non-overlapping `window_size x window_size` windows; odd layers shift the windows by
`window_size // 2` with a cyclic roll and mask the pairs that the roll brought together from opposite borders.

Unlike Swin's `input_resolution`, nothing here is tied to a grid: a grid that the window does not divide is padded
at the bottom and right (as Swin's detection code and timm's SAM-ViT do), and the padded tokens are masked as keys,
so padding never changes the outputs of real tokens. Grid-dependent tensors are cached per grid and device, outside
the state dict.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import trunc_normal_
from torch import Tensor, nn

from .attention import qkv_and_proj, sdpa_backend_name
from .base import Grid, TokenMixer, check_bool_option, check_int_option, check_tokens, grid_cached
from .registry import register_mixer

# Finite, so that a query whose window holds only masked keys (a padded token's query) gets a uniform softmax
# instead of NaN; large enough that exp() of it is exactly 0 in fp32/bf16/fp16 next to any sane bias. Swin uses
# -100, which a learned bias of a few tens could in principle approach.
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


def window_mask(grid: Grid, window_size: int, shift: int, device: torch.device | None = None) -> Tensor | None:
    """Additive attention mask for each window of the padded, cyclically shifted grid.

    A key is masked for a query when the two lie in different shift regions of the Swin paper (the roll carried one
    of them across the border) or when the key is a padding token. Both conditions are merged before the mask value
    is applied, so a pair is masked once, never twice.

    Args:
        grid: the real token grid `(H, W)`.
        window_size: side of the square window.
        shift: cyclic shift of the windows (0 for regular windows).
        device: where to build the mask.

    Returns:
        Float tensor `(num_windows, L, L)` with 0 for allowed pairs and `MASK_VALUE` otherwise (windows in row-major
        order of the padded grid, `L = window_size ** 2`), or None when no pair is masked.
    """
    H, W = grid
    ws = window_size
    Hp, Wp = math.ceil(H / ws) * ws, math.ceil(W / ws) * ws
    if shift == 0 and (Hp, Wp) == (H, W):
        return None

    def regions(size: int) -> Tensor:
        # Shift-region label of each row (column) of the rolled, padded grid: the last window of a shifted layer
        # holds the rows that wrapped around (label 2) next to the ones that did not (label 1).
        label = torch.zeros(size, dtype=torch.long, device=device)
        if shift:
            label[size - ws:size - shift] = 1
            label[size - shift:] = 2
        return label

    region = regions(Hp)[:, None] * 3 + regions(Wp)[None, :]  # (Hp, Wp)
    real = torch.zeros(Hp, Wp, dtype=torch.bool, device=device)
    real[:H, :W] = True
    real = torch.roll(real, shifts=(-shift, -shift), dims=(0, 1))  # (Hp, Wp), same roll as the tokens
    region = rearrange(region, "(nh wh) (nw ww) -> (nh nw) (wh ww)", wh=ws, ww=ws)  # (nW, L)
    real = rearrange(real, "(nh wh) (nw ww) -> (nh nw) (wh ww)", wh=ws, ww=ws)  # (nW, L)
    blocked = (region[:, :, None] != region[:, None, :]) | ~real[:, None, :]  # (nW, L query, L key)
    return torch.zeros(blocked.shape, device=device).masked_fill(blocked, MASK_VALUE)  # (nW, L, L)


@register_mixer("swin")
class SwinAttention(TokenMixer):
    """Window multi-head self-attention with relative position bias; odd layers use shifted windows.

    Parameters carry timm's `WindowAttention` names (`qkv`, `proj`, `relative_position_bias_table`), so weights
    copy between the two. Attention runs through `F.scaled_dot_product_attention` with the float mask
    `bias + mask`, which on CUDA selects the memory-efficient kernel (it accepts an arbitrary bias with a
    gradient); `impl` records the backend that PyTorch picked.

    The `qkv` and `proj` projections act on the real tokens only; padding is applied to their output (q, k, v),
    where the padded keys are masked and the padded queries are cropped: real tokens' outputs are what they would
    be with any padding, and no projection work is spent on it. Attention itself runs on whole padded windows, so
    a grid much smaller than the window (e.g. 4 x 4 with window 7) pays for the full 7 x 7 window; `macs`
    counts that work.
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

    def _index(self, device: torch.device) -> Tensor:
        return grid_cached(self._cache, ("index", device), lambda: relative_position_index(self.window_size, device))

    def _mask(self, grid: Grid, device: torch.device) -> Tensor | None:
        return grid_cached(self._cache, ("mask", grid, device),
                           lambda: window_mask(grid, self.window_size, self.shift, device))

    def relative_position_bias(self) -> Tensor:
        """The bias that every window adds to its attention logits, shape `(heads, L, L)`."""
        L = self.window_size ** 2
        index = self._index(self.relative_position_bias_table.device)
        bias = self.relative_position_bias_table[index.view(-1)]  # (L * L, heads)
        return rearrange(bias, "(i j) h -> h i j", i=L, j=L)  # (heads, L, L)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """Attends inside (shifted) windows of the grid.

        Args:
            x: tokens `(B, H * W, C)` in row-major order of `grid`.
            grid: the token grid `(H, W)`.

        Returns:
            Tokens of the same shape as `x`.
        """
        check_tokens(x, grid)
        B, _, C = x.shape
        H, W = grid
        ws, s = self.window_size, self.shift
        Hp, Wp = math.ceil(H / ws) * ws, math.ceil(W / ws) * ws

        qkv = self.qkv(x).view(B, H, W, 3 * C)  # (B, H, W, 3C)
        qkv = F.pad(qkv, (0, 0, 0, Wp - W, 0, Hp - H))  # (B, Hp, Wp, 3C), padding at bottom and right
        if s:
            qkv = torch.roll(qkv, shifts=(-s, -s), dims=(1, 2))  # (B, Hp, Wp, 3C)
        # Windows and heads share one axis so that the per-window mask broadcasts over the batch and SDPA gets
        # 4-D inputs (which its fused kernels need).
        q, k, v = rearrange(qkv, "b (nh wh) (nw ww) (three h d) -> three b (nh nw h) (wh ww) d",
                            wh=ws, ww=ws, three=3, h=self.num_heads)  # 3 x (B, nW * heads, L, head_dim)

        bias = self.relative_position_bias()  # (heads, L, L)
        mask = self._mask((H, W), x.device)  # (nW, L, L) or None
        n_windows = (Hp // ws) * (Wp // ws)
        if mask is None:
            attn_mask = bias.expand(n_windows, -1, -1, -1)  # (nW, heads, L, L)
        else:
            attn_mask = bias.unsqueeze(0) + mask.unsqueeze(1)  # (nW, heads, L, L)
        attn_mask = attn_mask.reshape(n_windows * self.num_heads, ws * ws, ws * ws).to(q.dtype)  # (nW*heads, L, L)

        self.impl = sdpa_backend_name(q, k, v, attn_mask)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, nW * heads, L, head_dim)
        out = rearrange(out, "b (nh nw h) (wh ww) d -> b (nh wh) (nw ww) (h d)",
                        nh=Hp // ws, nw=Wp // ws, h=self.num_heads, wh=ws, ww=ws)  # (B, Hp, Wp, C)
        if s:
            out = torch.roll(out, shifts=(s, s), dims=(1, 2))  # (B, Hp, Wp, C)
        out = out[:, :H, :W].reshape(B, H * W, C)  # (B, N, C)
        return self.proj(out)

    def macs(self, grid: Grid) -> int:
        """Forward multiply-accumulates for one image on `grid`.

        Counts the q, k, v and output projections on the `H * W` real tokens, and `Q K^T` and `A V` over every
        window of the padded grid (padded queries and keys are computed, then masked or dropped). The bias
        gather, mask add and softmax are not counted (the repository's convention for element-wise work).
        """
        H, W = grid
        ws = self.window_size
        n_real = H * W
        n_padded = math.ceil(H / ws) * ws * math.ceil(W / ws) * ws
        projections = n_real * self.dim * 3 * self.dim + n_real * self.dim * self.dim
        attention = 2 * n_padded * ws * ws * self.dim  # QK^T and AV: per window L * L * C each
        return projections + attention
