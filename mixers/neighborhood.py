"""Neighbourhood attention (NAT, Hassani et al., CVPR 2023; NATTEN's semantics, dilation 1).

Each query attends to the `k x k` keys centred on it; near a border the window is shifted inwards (not cropped), so
every query sees exactly `k * k` keys. Along an axis of length n the window of a query at i starts at
`clamp(i - k // 2, 0, n - k)` (NATTEN's `get_window_start`). A learned relative position bias, NAT's `rpb` of shape
`(heads, 2k - 1, 2k - 1)`, adds `rpb[h, dy + k - 1, dx + k - 1]` for a key at offset (dy, dx) from its query
(NATTEN's `get_pb_start` reduces to this offset rule).

A grid smaller than the kernel along an axis clips the kernel to that axis: on a 3 x 20 grid with k = 7 every query
attends to 3 x 7 keys, all three rows. NATTEN refuses such inputs; clipping keeps every token count of a resolution
sweep valid, and the offsets still index inside the bias table.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.flop_counter import FlopCounterMode

from .attention import qkv_and_proj
from .base import Grid, TokenMixer, check_bool_option, check_int_option, check_tokens, grid_cached
from .registry import register_mixer

NEIGHBORHOOD_IMPLS = ("auto", "tiled", "gather", "flex", "flex_compiled")
# Query tiles of `tiled`: TILE x TILE queries attend densely (masked) to the key rectangle that holds all their
# neighbourhoods, (TILE + k - 1)^2 keys.
TILE = 8


def clipped_kernel(grid: Grid, kernel_size: int) -> tuple[int, int]:
    """The kernel's extent along each axis of `grid`: `kernel_size`, or the axis length where that is shorter."""
    return min(kernel_size, grid[0]), min(kernel_size, grid[1])


def window_start(index: Tensor, length: int, kernel: int) -> Tensor:
    """First key position of the window of each query position along one axis (dilation 1)."""
    return (index - kernel // 2).clamp(0, length - kernel)


def neighbourhood_index(grid: Grid, kernel_size: int, table_side: int, device: torch.device | None = None,
                        ) -> tuple[Tensor, Tensor]:
    """Key indices and bias-table indices of every query's neighbourhood.

    Args:
        grid: token grid (H, W).
        kernel_size: requested side of the neighbourhood (clipped per axis by `clipped_kernel`).
        table_side: side of the bias table, 2 * kernel_size - 1.
        device: where to build them.

    Returns:
        `keys (N, kh * kw)`: row-major token index of each key, in row-major order of the window;
        `bias (N, kh * kw)`: flat index into the `(table_side, table_side)` bias table of each pair.
    """
    H, W = grid
    kh, kw = clipped_kernel(grid, kernel_size)
    centre = kernel_size - 1  # offset 0 sits at the middle of the table
    rows = window_start(torch.arange(H, device=device), H, kh)[:, None] + torch.arange(kh, device=device)  # (H, kh)
    cols = window_start(torch.arange(W, device=device), W, kw)[:, None] + torch.arange(kw, device=device)  # (W, kw)
    key_r = rows[:, None, :, None].expand(H, W, kh, kw)  # (H, W, kh, kw)
    key_c = cols[None, :, None, :].expand(H, W, kh, kw)  # (H, W, kh, kw)
    dy = key_r - torch.arange(H, device=device)[:, None, None, None]
    dx = key_c - torch.arange(W, device=device)[None, :, None, None]
    keys = (key_r * W + key_c).reshape(H * W, kh * kw)
    bias = ((dy + centre) * table_side + (dx + centre)).reshape(H * W, kh * kw)
    return keys, bias


def _axis_tiles(length: int, kernel: int, tile: int, device: torch.device | None) -> tuple[Tensor, Tensor]:
    """Query tiles and their key spans along one axis: `queries (T, t)` and `keys (T, K)` positions, where
    t = min(tile, length), K = min(t + kernel - 1, length). The last tile is moved inwards (so it may repeat
    queries of the one before), and each key span is the K positions that hold every window of its queries."""
    t = min(tile, length)
    span = min(t + kernel - 1, length)
    starts = (torch.arange(-(-length // t), device=device) * t).clamp(max=length - t)  # (T,)
    queries = starts[:, None] + torch.arange(t, device=device)  # (T, t)
    key_starts = window_start(starts, length, kernel).clamp(max=length - span)  # (T,)
    keys = key_starts[:, None] + torch.arange(span, device=device)  # (T, K)
    return queries, keys


def neighbourhood_tiles(grid: Grid, kernel_size: int, table_side: int, tile: int = TILE,
                        device: torch.device | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The tiles of `tiled`: rectangles of queries, each with the key rectangle that holds all their neighbourhoods.

    Returns:
        `queries (T, tq)`: row-major token index of each query slot of each tile (a token may sit in two tiles);
        `home (N,)`: the flat slot (tile * tq + slot) whose result each token takes, its first;
        `keys (T, tk)`: token index of each key of each tile's rectangle;
        `bias (T, tq, tk)`: flat index into the `(table_side, table_side)` bias table of each (query, key) pair, or
        -1 where the key lies outside the query's neighbourhood.
    """
    H, W = grid
    kh, kw = clipped_kernel(grid, kernel_size)
    centre = kernel_size - 1
    q_rows, k_rows = _axis_tiles(H, kh, tile, device)  # (Tr, th), (Tr, Kr)
    q_cols, k_cols = _axis_tiles(W, kw, tile, device)  # (Tc, tw), (Tc, Kc)
    Tr, Tc = q_rows.shape[0], q_cols.shape[0]

    def pairs(q_pos: Tensor, k_pos: Tensor, length: int, kernel: int) -> tuple[Tensor, Tensor]:
        """Per axis: the key's offset from its query (T, t, K), and whether it lies in the query's window."""
        start = window_start(q_pos, length, kernel)[:, :, None]
        inside = (k_pos[:, None, :] >= start) & (k_pos[:, None, :] < start + kernel)
        return k_pos[:, None, :] - q_pos[:, :, None], inside

    dy, in_r = pairs(q_rows, k_rows, H, kh)  # (Tr, th, Kr)
    dx, in_c = pairs(q_cols, k_cols, W, kw)  # (Tc, tw, Kc)
    # Tile (i, j): queries (q_rows[i] x q_cols[j]), keys (k_rows[i] x k_cols[j]), both row-major.
    queries = (q_rows[:, None, :, None] * W + q_cols[None, :, None, :]).reshape(Tr * Tc, -1)
    keys = (k_rows[:, None, :, None] * W + k_cols[None, :, None, :]).reshape(Tr * Tc, -1)
    index = (dy[:, None, :, None, :, None] + centre) * table_side + (dx[None, :, None, :, None, :] + centre)
    inside = in_r[:, None, :, None, :, None] & in_c[None, :, None, :, None, :]  # (Tr, Tc, th, tw, Kr, Kc)
    bias = index.masked_fill(~inside, -1).reshape(Tr * Tc, queries.shape[1], keys.shape[1])
    slots = torch.arange(queries.numel(), device=device)
    home = torch.full((H * W,), queries.numel(), dtype=torch.long, device=device)
    home = home.scatter_reduce(0, queries.flatten(), slots, reduce="amin")
    return queries, home, keys, bias


def neighbourhood_mask_mod(grid: Grid, kernel_size: int) -> Callable:
    """FlexAttention `mask_mod`: whether key `kv_idx` lies in the neighbourhood of query `q_idx` (row-major)."""
    H, W = grid
    kh, kw = clipped_kernel(grid, kernel_size)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        r0 = window_start(q_idx // W, H, kh)
        c0 = window_start(q_idx % W, W, kw)
        kr, kc = kv_idx // W, kv_idx % W
        return (kr >= r0) & (kr < r0 + kh) & (kc >= c0) & (kc < c0 + kw)

    return mask_mod


def _flop_counting() -> bool:
    """True while torch's FlopCounterMode counts this call: the count must be the neighbourhood's products
    (`macs`), which gather computes exactly and tiled (its padded key rectangles) does not."""
    return any(type(mode).__name__ == "_FlopCounterMode" or isinstance(mode, FlopCounterMode)
               for mode in _get_current_dispatch_mode_stack())


@functools.cache
def _flex() -> tuple[Callable, Callable] | None:
    """(flex_attention, create_block_mask) where this torch has them, else None."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    return flex_attention, create_block_mask


@functools.cache
def _compiled_flex() -> Callable:
    """flex_attention compiled once: eager flex materialises the scores; compiled, it is a fused block-sparse kernel.

    Dynamic in the batch (`_attend_flex` marks it), so a batch-`max` search (1, 2, 4, ... 1024) compiles twice per
    grad mode and dtype (batch 1 is specialised, then one dynamic graph) instead of once per batch: with static
    shapes it passed dynamo's recompile limit (8) and fell back to eager flex, which builds the N x N scores.
    Static in everything else (`dynamic=False` turns dynamo's automatic dynamic shapes off; the batch mark still
    holds): a second grid in one process would otherwise make the token count and the score_mod's captured grid
    ints symbolic, which torch 2.11's flex lowering cannot take ("'ShapeAsConstantBuffer' object has no attribute
    'dtype'", seen on an H200); a new grid compiles its own static graph instead.
    """
    return torch.compile(_flex()[0], dynamic=False)


@register_mixer("neighborhood")
class NeighborhoodAttention(TokenMixer):
    """Multi-head neighbourhood attention with NAT's relative position bias.

    Three exact implementations, recorded in `impl`:
    - `tiled` (CPU): the grid is cut into `TILE x TILE` tiles of queries; each tile attends, in one fused
      `scaled_dot_product_attention` call over all tiles, to the key rectangle that holds every neighbourhood of its
      queries, `(TILE + k - 1)^2` keys, with an additive mask that is NAT's bias inside a query's neighbourhood and
      -inf outside. Dense matmuls on small tiles: about 4 times the neighbourhood's products at k = 7 (more than
      `macs` counts, as `flex`), and 4 times faster than `gather` on a CPU, forward and backward.
    - `gather` (meta, and the reference): each query's `kh * kw` keys and values are gathered by a per-grid index,
      scores are `(1 x d) @ (d x kk)` batched matmuls, so the counters see exactly the neighbourhood's work. Memory
      holds the gathered keys and values, `2 x N x kk x C` per image: on a CPU the gather was about 3/4 of the time.
    - `flex` (CUDA, where `torch.nn.attention.flex_attention` imports): compiled FlexAttention with a block mask
      built from the neighbourhood rule and the bias as a `score_mod`. In raster order it computes whole 128 x 128
      blocks that the mask touches, more than `macs` counts (which is the neighbourhood's work, as NATTEN does).
      `flex_compiled` forces the compiled kernel on any device: on a CPU inductor compiles it, so the CUDA
      path's own code (compile, dynamic batch, counting) runs in CPU tests; forward only there, since
      FlexAttention has no CPU backward.
    While `torch.jit.trace` (fvcore's count) or `FlopCounterMode` runs, the gather path stands in for flex and
    tiled: dynamo refuses to run inside a jit trace, and gather computes the same function with exactly the
    neighbourhood's products, which is what the counts must report.
    The per-grid indices, tiles and block masks are cached outside the state dict.

    Parameters: `qkv` and `proj` as `attention`, plus the bias table `rpb`, `heads x (2k - 1)^2` numbers (338 at
    two heads and k = 7): 2% above attention's count at the micro preset, 0.3% at tiny.

    Args:
        dim: token channels C.
        num_heads: heads; `dim` must be divisible by it.
        layer_idx: unused.
        kernel_size: side k of the neighbourhood, odd (NAT uses 7).
        qkv_bias: bias on the fused q, k, v projection.
        rel_pos_bias: learn NAT's relative position bias; False gives plain neighbourhood attention.
        impl: `auto` (flex on CUDA where it imports, tiled elsewhere, gather on the meta device), `tiled`,
            `gather`, `flex` (on a CPU flex runs eagerly and forward only: for tests of its mask) or `flex_compiled`
            (compiled on any device; on the meta device, which no kernel runs on, gather).
    """

    def __init__(self, dim: int, num_heads: int, *, layer_idx: int = 0, kernel_size: int = 7, qkv_bias: bool = True,
                 rel_pos_bias: bool = True, impl: str = "auto") -> None:
        super().__init__()
        # Types and ranges first (issue 35): a TOML `true` or a 0 would otherwise build a degenerate mixer.
        check_int_option("neighborhood", "kernel_size", kernel_size)
        check_bool_option("neighborhood", "qkv_bias", qkv_bias)
        check_bool_option("neighborhood", "rel_pos_bias", rel_pos_bias)
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"neighborhood: kernel_size must be odd and >= 1 (a window centred on its query), "
                             f"got {kernel_size}")
        if impl not in NEIGHBORHOOD_IMPLS:
            raise ValueError(f"neighborhood: unknown impl {impl!r}; choose one of {', '.join(NEIGHBORHOOD_IMPLS)}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.kernel_size = kernel_size
        self.requested_impl = impl
        self.qkv, self.proj = qkv_and_proj(dim, qkv_bias)
        self.rpb = None
        if rel_pos_bias:
            self.rpb = nn.Parameter(torch.zeros(num_heads, 2 * kernel_size - 1, 2 * kernel_size - 1))
            trunc_normal_(self.rpb, std=0.02)
        self.impl = "not_run"
        self._cache: dict[tuple, object] = {}  # per (grid, device): indices or block masks, not in the state dict

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, kernel_size={self.kernel_size}"

    def _resolve_impl(self, device: torch.device) -> str:
        if self.requested_impl in ("flex", "flex_compiled"):
            if _flex() is None:
                raise RuntimeError(f"neighborhood: impl={self.requested_impl!r} needs "
                                   "torch.nn.attention.flex_attention (torch >= 2.5)")
            if self.requested_impl == "flex_compiled" and device.type == "meta":
                return "gather"
            return self.requested_impl
        if self.requested_impl == "auto" and device.type == "cuda" and _flex() is not None:
            return "flex"
        if self.requested_impl in ("auto", "tiled") and device.type != "meta":
            return "tiled"
        return "gather"

    def _indices(self, grid: Grid, device: torch.device) -> tuple[Tensor, Tensor]:
        return grid_cached(self._cache, ("gather", grid, device),
                           lambda: neighbourhood_index(grid, self.kernel_size, 2 * self.kernel_size - 1, device))

    def _block_mask(self, grid: Grid, device: torch.device):
        n = grid[0] * grid[1]
        return grid_cached(self._cache, ("flex", grid, device),
                           lambda: _flex()[1](neighbourhood_mask_mod(grid, self.kernel_size), None, None, n, n,
                                              device=device))

    def _attend_gather(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        keys, bias_index = self._indices(grid, q.device)
        k_n, v_n = k[:, :, keys], v[:, :, keys]  # (B, heads, N, kk, head_dim) each
        scores = (q * self.scale).unsqueeze(-2) @ k_n.transpose(-2, -1)  # (B, heads, N, 1, kk)
        if self.rpb is not None:
            bias = self.rpb.flatten(1)[:, bias_index]  # (heads, N, kk)
            scores = scores + bias.unsqueeze(-2).to(scores.dtype)
        return (scores.softmax(dim=-1) @ v_n).squeeze(-2)  # (B, heads, N, head_dim)

    def _tiles(self, grid: Grid, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return grid_cached(self._cache, ("tiled", grid, device),
                           lambda: neighbourhood_tiles(grid, self.kernel_size, 2 * self.kernel_size - 1, TILE, device))

    def _attend_tiled(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        queries, home, keys, bias_index = self._tiles(grid, q.device)
        B, heads, _, d = q.shape
        T, tq = queries.shape
        inside = bias_index >= 0  # (T, tq, tk)
        if self.rpb is not None:
            mask = self.rpb.flatten(1)[:, bias_index.clamp(min=0)].to(q.dtype)  # (heads, T, tq, tk)
        else:
            mask = q.new_zeros(1, *bias_index.shape).expand(heads, -1, -1, -1)
        mask = mask.masked_fill(~inside, float("-inf")).flatten(0, 1)  # (heads * T, tq, tk)

        def tiles(t: Tensor, index: Tensor) -> Tensor:  # (B, heads, N, d) -> (B, heads * T, len, d)
            return t[:, :, index].flatten(1, 2)

        out = F.scaled_dot_product_attention(tiles(q, queries), tiles(k, keys), tiles(v, keys), attn_mask=mask,
                                             scale=self.scale)  # (B, heads * T, tq, d)
        return out.reshape(B, heads, T * tq, d)[:, :, home]  # (B, heads, N, d)

    def _attend_flex(self, q: Tensor, k: Tensor, v: Tensor, grid: Grid) -> Tensor:
        W, side, centre = grid[1], 2 * self.kernel_size - 1, self.kernel_size - 1
        score_mod = None
        if self.rpb is not None:
            table = self.rpb.flatten(1)  # (heads, side * side)

            def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                # Clamped: the score_mod also sees masked pairs (eager flex evaluates every pair), whose offsets
                # fall outside the table.
                dy = (kv_idx // W - q_idx // W).clamp(-centre, centre)
                dx = (kv_idx % W - q_idx % W).clamp(-centre, centre)
                return score + table[h, (dy + centre) * side + (dx + centre)].to(score.dtype)

        if self.impl == "flex_compiled" or q.device.type == "cuda":
            if not torch.compiler.is_compiling():  # inside a compiled model the outer graph decides (`compile`)
                for t in (q, k, v):  # dynamic in the batch: one graph serves every batch of a batch-max search
                    torch._dynamo.maybe_mark_dynamic(t, 0)
            flex = _compiled_flex()
        else:
            flex = _flex()[0]
        return flex(q, k, v, score_mod=score_mod, block_mask=self._block_mask(grid, q.device), scale=self.scale)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """Each token attends to its neighbourhood on `grid`; `x` is `(B, H * W, C)` in row-major order."""
        check_tokens(x, grid)
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        # q, k, v: (B, heads, N, head_dim)
        impl = self._resolve_impl(x.device)
        if impl != "gather" and (torch.jit.is_tracing() or _flop_counting()):  # counts run gather: class doc
            impl = "gather"
        else:
            self.impl = impl  # what a measured call ran, not what the count's trace ran
        if impl in ("flex", "flex_compiled"):
            out = self._attend_flex(q, k, v, grid)
        elif impl == "tiled":
            out = self._attend_tiled(q, k, v, grid)
        else:
            out = self._attend_gather(q, k, v, grid)
        return self.proj(out.transpose(1, 2).reshape(B, N, C))  # (B, N, C)

    def macs(self, grid: Grid) -> int:
        """Forward MACs for one image: q, k, v and output projections, then `q k^T` and `A v` over each query's
        `kh x kw` keys. The bias gather, softmax and scaling are element-wise and not counted."""
        n = grid[0] * grid[1]
        kh, kw = clipped_kernel(grid, self.kernel_size)
        return 4 * n * self.dim * self.dim + 2 * n * kh * kw * self.dim
