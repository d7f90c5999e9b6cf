"""Vision Mamba (Vim, Zhu et al., 2024): the bidirectional Mamba block, "bimamba v2"."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Grid, TokenMixer, check_bool_option, check_int_option, check_positive_option, check_tokens
from .registry import register_mixer
from .ops.selective_scan import SCAN_IMPLS, selective_scan, selective_scan_flops
from .ops.token_conv import depthwise_conv_tokens, depthwise_conv_tokens_macs


def _scan_param(p: Tensor) -> Tensor:
    """A parameter in at least float32: the scan's A, D and dt bias are float32 in mamba-ssm, float64 stays."""
    return p.to(torch.promote_types(p.dtype, torch.float32))


@register_mixer("mamba")
class VimMixer(TokenMixer):
    """Bidirectional selective-state-space mixer of Vision Mamba (bimamba v2, `if_divide_out=True`).

    The tokens, in row-major grid order, are read as one sequence. A shared `in_proj` gives the scan input x and
    the gate z; each direction has its own depthwise causal conv, `x_proj` (to dt, B, C), `dt_proj`, `A_log` and
    `D`, the backward direction suffixed `_b` as in Vim so state dicts line up; the backward direction is Vim's
    scan of the flipped sequence (z flipped with it), flipped back; `out_proj((y_fwd + y_bwd) / 2)`.
    Initialisation follows mamba-ssm's `Mamba`. The backward direction runs on the unflipped x and z, its conv
    anti-causal and its scan reading the sequence backwards (natively in `triton` and `cpp_loop`, by flipping the
    scan's inputs and output in `selective_scan` elsewhere): Vim's flip, scan, flip back, with nothing flipped
    where the kernel reads backwards (tests/test_selective_scan_triton.py checks the two agree).

    Everything stays time-major (B, L, channels), as the projections give and take it: the conv runs on the
    time-major rows (`depthwise_conv_tokens`), the scan gets (B, channels, L) views, and the kernels that read rows
    along L get them contiguous from `selective_scan`. On the CPU the channel-major copies and the conv on them
    took about a fifth of the mixer's forward.

    Args:
        dim: token channels C (Mamba's `d_model`).
        num_heads: accepted for the common mixer signature and ignored.
        layer_idx: unused.
        d_state: state size N per channel.
        d_conv: depthwise causal conv width.
        expand: d_inner = expand * dim, the scanned channels.
        dt_rank: rank of the dt projection; `auto` is ceil(dim / 16).
        dt_min: smallest initial step size.
        dt_max: largest initial step size.
        dt_init_floor: floor of the initial step size.
        conv_bias: bias on the depthwise convs.
        bias: bias on in_proj and out_proj.
        scan_impl: selective-scan implementation, see `mixers.ops.selective_scan.selective_scan` (`auto` picks
            mamba-ssm's CUDA kernel where it runs, else the Triton kernels on CUDA, else the pure-PyTorch custom op).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        layer_idx: int = 0,
        d_state: int = 16,
        d_conv: int = 4,
        expand: int = 2,
        dt_rank: int | str = "auto",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        conv_bias: bool = True,
        bias: bool = False,
        scan_impl: str = "auto",
    ) -> None:
        super().__init__()
        # Types and ranges first (issue 35): a TOML `true` or a 0 would otherwise build a degenerate mixer.
        check_int_option("mamba", "d_state", d_state)
        check_int_option("mamba", "d_conv", d_conv)
        check_int_option("mamba", "expand", expand)
        check_positive_option("mamba", "dt_min", dt_min)
        check_positive_option("mamba", "dt_max", dt_max)
        check_positive_option("mamba", "dt_init_floor", dt_init_floor)
        check_bool_option("mamba", "conv_bias", conv_bias)
        check_bool_option("mamba", "bias", bias)
        if dt_rank != "auto":
            check_int_option("mamba", "dt_rank", dt_rank)
        if dt_rank != "auto" and not (isinstance(dt_rank, int) and dt_rank > 0):
            raise ValueError(f"mamba: dt_rank must be 'auto' or a positive int, got {dt_rank!r}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"mamba: need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        if scan_impl not in SCAN_IMPLS:
            raise ValueError(f"mamba: unknown scan_impl {scan_impl!r}; choose one of {', '.join(SCAN_IMPLS)}")
        self.dim = dim
        self.d_state = d_state
        self.d_conv = d_conv
        self.d_inner = expand * dim
        self.dt_rank = math.ceil(dim / 16) if dt_rank == "auto" else dt_rank
        self.scan_impl = scan_impl
        self.impl = "not_run"

        self.in_proj = nn.Linear(dim, 2 * self.d_inner, bias=bias)
        self.conv1d = self._make_conv(conv_bias)
        self.conv1d_b = self._make_conv(conv_bias)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.x_proj_b = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = self._make_dt_proj(dt_min, dt_max, dt_init_floor)
        self.dt_proj_b = self._make_dt_proj(dt_min, dt_max, dt_init_floor)
        self.A_log = self._make_A_log()
        self.A_b_log = self._make_A_log()
        self.D = self._make_D()
        self.D_b = self._make_D()
        self.out_proj = nn.Linear(self.d_inner, dim, bias=bias)

    def _make_conv(self, conv_bias: bool) -> nn.Conv1d:
        """Depthwise conv as Vim holds it (padding d_conv - 1, which `_direction` makes causal by taking d_conv - 1
        taps before each step); its weight and bias are what `_direction` reads."""
        return nn.Conv1d(
            self.d_inner, self.d_inner, self.d_conv, padding=self.d_conv - 1, groups=self.d_inner, bias=conv_bias
        )

    def _make_dt_proj(self, dt_min: float, dt_max: float, dt_init_floor: float) -> nn.Linear:
        """Mamba's dt init: weight uniform +-dt_rank^-0.5; bias = softplus^-1(dt), dt log-uniform in [min, max].

        The bias is flagged `_no_reinit` (mamba-ssm's convention) so a model-wide init leaves it alone.
        """
        dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        std = self.dt_rank**-0.5
        nn.init.uniform_(dt_proj.weight, -std, std)
        dt = torch.exp(torch.rand(self.d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        inv_dt = dt + torch.log(-torch.expm1(-dt))  # softplus(inv_dt) == dt
        with torch.no_grad():
            dt_proj.bias.copy_(inv_dt)
        dt_proj.bias._no_reinit = True
        return dt_proj

    def _make_A_log(self) -> nn.Parameter:
        """S4D-real init, A = -(1, 2, ..., N) for every channel, stored as log(-A) (d_inner, N), no weight decay."""
        A = torch.arange(1, self.d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)  # (d_inner, N)
        A_log = nn.Parameter(torch.log(A))
        A_log._no_weight_decay = True
        return A_log

    def _make_D(self) -> nn.Parameter:
        """Skip weights D = 1 (d_inner,), no weight decay."""
        D = nn.Parameter(torch.ones(self.d_inner))
        D._no_weight_decay = True
        return D

    def _direction(
        self,
        x: Tensor,
        z: Tensor,
        conv1d: nn.Conv1d,
        x_proj: nn.Linear,
        dt_proj: nn.Linear,
        A_log: Tensor,
        D: Tensor,
        reverse: bool = False,
    ) -> Tensor:
        """One direction of the block on time-major x, z (B, L, d_inner); returns the gated scan output as a
        (B, d_inner, L) tensor (time-major in memory where the scan keeps its input's layout).

        `reverse` runs the direction from the last token to the first without flipping: the conv becomes
        anti-causal (Vim's causal conv of the flipped sequence, flipped back, is the conv with its taps reversed
        reaching forwards) and the scan reads the sequence backwards.
        """
        # silu(conv(x)), (B, L, d_inner), the activation applied by the conv as it writes each row
        if reverse:
            u = depthwise_conv_tokens(x, conv1d.weight.flip(-1), conv1d.bias, left=0, silu=True)
        else:
            u = depthwise_conv_tokens(x, conv1d.weight, conv1d.bias, left=self.d_conv - 1, silu=True)
        x_dbl = x_proj(u)  # (B, L, dt_rank + 2 N)
        dt, B, C = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        # dt_proj's bias is applied inside the scan (before softplus), as Mamba does.
        delta = F.linear(dt, dt_proj.weight)  # (B, L, d_inner)
        y, self.impl = selective_scan(
            *(t.transpose(1, 2) for t in (u, delta)),  # (B, d_inner, L) views
            -torch.exp(_scan_param(A_log)),
            *(t.transpose(1, 2) for t in (B, C)),  # (B, N, L) views
            _scan_param(D),
            z.transpose(1, 2),
            delta_bias=_scan_param(dt_proj.bias),
            delta_softplus=True,
            impl=self.scan_impl,
            reverse=reverse,
        )
        return y

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """Mixes `x` (B, N, C) over its N tokens in row-major grid order; the grid shape is otherwise unused."""
        check_tokens(x, grid)
        x_in, z = self.in_proj(x).chunk(2, dim=-1)  # (B, L, d_inner) views each
        y_fwd = self._direction(x_in, z, self.conv1d, self.x_proj, self.dt_proj, self.A_log, self.D)
        y_bwd = self._direction(x_in, z, self.conv1d_b, self.x_proj_b, self.dt_proj_b, self.A_b_log, self.D_b,
                                reverse=True)
        # out_proj((y_fwd + y_bwd) / 2) with the halving on the weight (exact, a power of two), not on the
        # (B, d_inner, L) sum: one pass over it fewer.
        y = (y_fwd + y_bwd).transpose(1, 2)  # (B, L, d_inner)
        return F.linear(y, self.out_proj.weight * 0.5, self.out_proj.bias)  # (B, L, C)

    def macs(self, grid: Grid) -> int:
        """Forward MACs for one image: projections, both convs, both scans (4.5 L D N each).

        Each conv computes its L outputs, d_conv MACs each per channel; biases and element-wise work are not
        counted.
        """
        L = grid[0] * grid[1]
        d_inner, N = self.d_inner, self.d_state
        in_proj = L * self.dim * 2 * d_inner
        conv = depthwise_conv_tokens_macs(1, L, d_inner, self.d_conv)
        x_proj = L * d_inner * (self.dt_rank + 2 * N)
        dt_proj = L * self.dt_rank * d_inner
        scan = selective_scan_flops(1, d_inner, L, N) // 2
        out_proj = L * d_inner * self.dim
        return in_proj + out_proj + 2 * (conv + x_proj + dt_proj + scan)
