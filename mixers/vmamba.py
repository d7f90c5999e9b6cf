"""VMamba's 2D selective scan, SS2D (Liu et al., "VMamba: Visual State Space Model", NeurIPS 2024).

The grid is read as four sequences, the cross-scan: row-major, column-major, and each of those reversed. Each is
scanned by its own selective scan (own x_proj, dt_proj, A, D), the outputs are put back in grid order and summed
(the cross-merge). Before the scans a depthwise 3 x 3 conv mixes each token with its 2D neighbours, which a causal
1D conv along one scan order (Vim's) cannot do.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .base import (Grid, TokenMixer, check_bool_option, check_int_option, check_positive_option, check_tokens,
                   grid_cached)
from .mamba import _scan_param
from .registry import register_mixer
from .ops.selective_scan import (SCAN_IMPLS, resolve_scan_impl, selective_scan, selective_scan_cpp_call,
                                 selective_scan_flops)

DIRECTIONS = 4  # row-major, column-major, row-major reversed, column-major reversed


def cross_scan(x: Tensor) -> list[Tensor]:
    """The four scan orders of a grid `x (B, D, H, W)`, each a sequence `(B, D, H * W)`."""
    rows = x.flatten(2)  # (B, D, H*W): row-major
    cols = x.transpose(2, 3).flatten(2)  # (B, D, W*H): column-major
    return [rows, cols, rows.flip(-1), cols.flip(-1)]


def scan_orders(grid: Grid, device: torch.device) -> Tensor:
    """The row-major position of each step of the four scan orders, `(4, H * W)` int64: `cross_scan` as indices."""
    H, W = grid
    rows = torch.arange(H * W, device=device)
    cols = rows.view(H, W).t().flatten()
    return torch.stack([rows, cols, rows.flip(0), cols.flip(0)])


def cross_merge(ys: list[Tensor], grid: Grid) -> Tensor:
    """Puts the four scan outputs `(B, D, H * W)` (in their scan orders) back in row-major grid order and sums them."""
    H, W = grid
    rows = ys[0] + ys[2].flip(-1)  # (B, D, H*W), row-major
    cols = ys[1] + ys[3].flip(-1)  # (B, D, W*H), column-major
    return rows + rearrange(cols, "b d (w h) -> b d (h w)", h=H, w=W)


def _dt_init(d_inner: int, dt_rank: int, dt_min: float, dt_max: float, dt_init_floor: float) -> tuple[Tensor, Tensor]:
    """Mamba's dt init for one direction: weight uniform +-dt_rank^-0.5 (d_inner, dt_rank); bias softplus^-1(dt)
    with dt log-uniform in [dt_min, dt_max] (d_inner,)."""
    std = dt_rank**-0.5
    weight = torch.empty(d_inner, dt_rank).uniform_(-std, std)
    dt = torch.exp(torch.rand(d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = dt.clamp(min=dt_init_floor)
    return weight, dt + torch.log(-torch.expm1(-dt))  # softplus(bias) == dt


@register_mixer("vmamba")
class SS2D(TokenMixer):
    """VMamba's SS2D block (the `v0` forward: gate z, out_norm) with the shape of VMamba's released v2 models.

    in_proj to (x, z); x through a depthwise `d_conv x d_conv` conv and SiLU; the cross-scan; per direction k
    `x_proj_weight[k]` to (dt, B, C), `dt_projs_weight[k]`, a selective scan with A = -exp(A_logs[k]) and skip
    Ds[k], the four directions in one call (`scan_directions`; our `mixers.ops.selective_scan`: the Triton kernels
    on CUDA, mamba-ssm's CUDA kernel where it imports, the compiled `cpp_loop` on the CPU, the PyTorch op where
    it cannot be built; `impl` records which); the cross-merge; `out_norm` (LayerNorm), gate by silu(z),
    out_proj. With `cpp_loop` the cross-scan and the merge are the kernel's: every tensor stays in grid order and
    the kernel walks each direction's order of it (`scan_grid`). Parameter names follow VMamba's SS2D
    (`x_proj_weight`, `dt_projs_weight`, `dt_projs_bias`, `A_logs`, `Ds`, stacked over the four directions).

    Where it departs from the released models: the forward is VMamba's v0 form (in_proj to 2 x d_inner, the z gate
    silu(z) after out_norm), while the released v2 checkpoints use the no-z form (in_proj to d_inner only, no gate
    branch); so the parameter count and the gating differ from a v2 model of the same width, and v2 weights do not
    load here. The shape below (d_state, d_conv, ratio) is v2's.

    Defaults follow VMamba-T v2 (`ssm_ratio=1`, `d_state=1`, `d_conv=3`, no conv bias): VMamba found d_state 1 as
    accurate and faster. With them the parameters are within 2% of attention's at the micro preset and 9% below at
    tiny; `expand=2, d_state=16` gives VMamba v1's shape (about 3.3x attention's parameters at micro).

    Args:
        dim: token channels C.
        num_heads: accepted for the common mixer signature and ignored.
        layer_idx: unused.
        d_state: state size N per channel.
        d_conv: side of the depthwise 2D conv.
        expand: d_inner = expand * dim (VMamba's ssm_ratio).
        dt_rank: rank of the dt projection; `auto` is ceil(dim / 16).
        dt_min: smallest initial step size.
        dt_max: largest initial step size.
        dt_init_floor: floor of the initial step size.
        conv_bias: bias on the depthwise conv.
        bias: bias on in_proj and out_proj.
        scan_impl: selective-scan implementation, see `mixers.ops.selective_scan.selective_scan`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        layer_idx: int = 0,
        d_state: int = 1,
        d_conv: int = 3,
        expand: int = 1,
        dt_rank: int | str = "auto",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        conv_bias: bool = False,
        bias: bool = False,
        scan_impl: str = "auto",
    ) -> None:
        super().__init__()
        # Types and ranges first (issue 35): a TOML `true` or a 0 would otherwise build a degenerate mixer.
        check_int_option("vmamba", "d_state", d_state)
        check_int_option("vmamba", "expand", expand)
        check_int_option("vmamba", "d_conv", d_conv)
        check_positive_option("vmamba", "dt_min", dt_min)
        check_positive_option("vmamba", "dt_max", dt_max)
        check_positive_option("vmamba", "dt_init_floor", dt_init_floor)
        check_bool_option("vmamba", "conv_bias", conv_bias)
        check_bool_option("vmamba", "bias", bias)
        if dt_rank != "auto":
            check_int_option("vmamba", "dt_rank", dt_rank)
        if dt_rank != "auto" and not (isinstance(dt_rank, int) and dt_rank > 0):
            raise ValueError(f"vmamba: dt_rank must be 'auto' or a positive int, got {dt_rank!r}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"vmamba: need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        if d_conv < 1 or d_conv % 2 == 0:
            raise ValueError(f"vmamba: d_conv must be odd (a conv centred on each token), got {d_conv}")
        if scan_impl not in SCAN_IMPLS:
            raise ValueError(f"vmamba: unknown scan_impl {scan_impl!r}; choose one of {', '.join(SCAN_IMPLS)}")
        self.dim = dim
        self.d_state = d_state
        self.d_conv = d_conv
        self.d_inner = d_inner = expand * dim
        self.dt_rank = math.ceil(dim / 16) if dt_rank == "auto" else dt_rank
        self.scan_impl = scan_impl
        self.impl = "not_run"

        self.in_proj = nn.Linear(dim, 2 * d_inner, bias=bias)
        self.conv2d = nn.Conv2d(d_inner, d_inner, d_conv, padding=d_conv // 2, groups=d_inner, bias=conv_bias)
        bound = d_inner**-0.5  # nn.Linear's default init, as VMamba's x_proj
        self.x_proj_weight = nn.Parameter(
            torch.empty(DIRECTIONS, self.dt_rank + 2 * d_state, d_inner).uniform_(-bound, bound))
        dts = [_dt_init(d_inner, self.dt_rank, dt_min, dt_max, dt_init_floor) for _ in range(DIRECTIONS)]
        self.dt_projs_weight = nn.Parameter(torch.stack([w for w, _ in dts]))  # (4, d_inner, dt_rank)
        self.dt_projs_bias = nn.Parameter(torch.stack([b for _, b in dts]))  # (4, d_inner)
        self.dt_projs_bias._no_reinit = True
        A = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(DIRECTIONS * d_inner, 1)  # S4D-real
        self.A_logs = nn.Parameter(torch.log(A))  # (4 d_inner, N)
        self.Ds = nn.Parameter(torch.ones(DIRECTIONS * d_inner))  # (4 d_inner,)
        self.A_logs._no_weight_decay = True
        self.Ds._no_weight_decay = True
        self.out_norm = nn.LayerNorm(d_inner)
        self.out_proj = nn.Linear(d_inner, dim, bias=bias)
        self._orders: dict[tuple, Tensor] = {}  # scan_orders per (grid, device), out of the state dict

    def scan_directions(self, xs: Tensor) -> Tensor:
        """The four directions' selective scans in one call: `xs (B, 4, d_inner, L)`, each direction's sequence in
        its own order, to the scan outputs, same shape.

        The directions are stacked on the channel axis (4 d_inner channels, each with its direction's A, D and dt
        bias) and B, C are grouped per direction (B, 4, N, L), as VMamba hands mamba-ssm's kernel: one call, not
        four, so the per-call work (softplus, layout, dispatch, a thread pool's start) is paid once.
        """
        d, n, r = self.d_inner, self.d_state, self.dt_rank
        # Batched matmuls broadcasting the weights over the batch, so every output comes contiguous as (B, 4, ., L)
        # and xs is read as it is: einsum put k first for its bmm, copying xs and its outputs both ways.
        x_dbl = torch.matmul(self.x_proj_weight, xs)  # (B, 4, r + 2N, L)
        dt, B, C = torch.split(x_dbl, [r, n, n], dim=2)  # (B, 4, r, L), (B, 4, N, L), (B, 4, N, L)
        delta = torch.matmul(self.dt_projs_weight, dt)  # (B, 4, d_inner, L)
        y, self.impl = selective_scan(
            xs.flatten(1, 2),  # (B, 4 d_inner, L)
            delta.flatten(1, 2),  # (B, 4 d_inner, L), contiguous along L as the kernels read it
            -torch.exp(_scan_param(self.A_logs)),  # (4 d_inner, N)
            B.contiguous(),  # (B, 4, N, L)
            C.contiguous(),  # (B, 4, N, L)
            _scan_param(self.Ds),
            None,
            delta_bias=_scan_param(self.dt_projs_bias.flatten()),  # (4 d_inner,)
            delta_softplus=True,
            impl=self.scan_impl,
        )
        return y.unflatten(1, (DIRECTIONS, d))  # (B, 4, d_inner, L)

    def _scan_orders(self, grid: Grid, device: torch.device) -> Tensor:
        """`scan_orders(grid)`, cached per grid in eager; compiled, built in the graph (a few index ops inductor
        folds): `grid_cached`'s inference-mode check is a graph break, which split every block's compiled graph."""
        if torch.compiler.is_compiling():
            return scan_orders(grid, device)
        return grid_cached(self._orders, (grid, device), lambda: scan_orders(grid, device))

    def scan_grid(self, u: Tensor, grid: Grid) -> Tensor:
        """The cross-scan, the four scans and the cross-merge of `u (B, L, d_inner)` in grid order, through the C++
        scan reading each direction's steps where they lie (`scan_orders`): to the summed outputs, `(B, L, d_inner)`.

        x_proj and dt_proj act on each token alone, so they run on the grid-order tokens (x_proj of all four
        directions as one matmul) and give each direction's dt, B and C at the token's place; the four directions
        read one u (an expanded view) and their outputs are summed where they lie. No sequence is gathered,
        flipped or scattered back, and the kernel stages time-major rows (a vector copy per step) where the stacked
        directions had it transpose channel-major tiles.
        """
        batch, L, d = u.shape
        n, r = self.d_state, self.dt_rank
        x_dbl = F.linear(u, self.x_proj_weight.flatten(0, 1)).unflatten(-1, (DIRECTIONS, r + 2 * n))  # (B, L, 4, .)
        dt, B, C = torch.split(x_dbl, [r, n, n], dim=-1)  # (B, L, 4, r), (B, L, 4, N), (B, L, 4, N)
        delta = torch.bmm(dt.permute(2, 0, 1, 3).reshape(DIRECTIONS, batch * L, r),
                          self.dt_projs_weight.transpose(1, 2))  # (4, B L, d_inner)
        order = self._scan_orders(grid, u.device)
        y = selective_scan_cpp_call(
            u.transpose(1, 2).unsqueeze(1).expand(batch, DIRECTIONS, d, L),  # one u, read by every direction
            delta.unflatten(1, (batch, L)).permute(1, 0, 3, 2),  # (B, 4, d_inner, L), time-major
            -torch.exp(_scan_param(self.A_logs)),  # (4 d_inner, N)
            B.permute(0, 2, 3, 1),  # (B, 4, N, L) views, a step's N values adjacent
            C.permute(0, 2, 3, 1),
            _scan_param(self.Ds),
            None,
            _scan_param(self.dt_projs_bias.flatten()),  # (4 d_inner,)
            True,
            False,
            order,
        )  # (B, 4, d_inner, L), laid out as delta: (4, B, L, d_inner) in memory
        return y.permute(1, 0, 3, 2).sum(0)  # (B, L, d_inner)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """Mixes `x (B, H * W, C)` by four selective scans over the grid `(H, W)`."""
        check_tokens(x, grid)
        H, W = grid
        xz = self.in_proj(x)  # (B, L, 2 d_inner)
        u, z = xz.chunk(2, dim=-1)  # (B, L, d_inner) each
        u = rearrange(u, "b (h w) d -> b d h w", h=H, w=W)
        u = F.silu(self.conv2d(u))  # (B, d_inner, H, W)
        if resolve_scan_impl(self.scan_impl, x.device, x.dtype) == "cpp_loop":
            y = self.scan_grid(rearrange(u, "b d h w -> b (h w) d"), grid)  # (B, L, d_inner)
            self.impl = "cpp_loop"
        else:
            ys = self.scan_directions(torch.stack(cross_scan(u), dim=1))  # (B, 4, d_inner, L)
            y = rearrange(cross_merge(list(ys.unbind(1)), grid), "b d l -> b l d")  # (B, L, d_inner)
        y = self.out_norm(y) * F.silu(z)
        return self.out_proj(y)

    def macs(self, grid: Grid) -> int:
        """Forward MACs for one image: projections, the depthwise conv (over the zero-padded border too), and per
        direction x_proj, dt_proj and the scan (4.5 L D N). Norm, gate and the merge are element-wise."""
        L = grid[0] * grid[1]
        d, n, r = self.d_inner, self.d_state, self.dt_rank
        in_proj = L * self.dim * 2 * d
        conv = L * d * self.d_conv**2
        per_direction = L * d * (r + 2 * n) + L * r * d
        scans = DIRECTIONS * selective_scan_flops(1, d, L, n) // 2
        return in_proj + conv + DIRECTIONS * per_direction + scans + L * d * self.dim
