"""Vision Mamba (Vim, Zhu et al., 2024): the bidirectional Mamba block, "bimamba v2"."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .base import Grid, TokenMixer, check_bool_option, check_int_option, check_positive_option, check_tokens
from .registry import register_mixer
from .ops.selective_scan import (
    NATIVE_REVERSE_IMPLS,
    SCAN_IMPLS,
    resolve_scan_impl,
    selective_scan,
    selective_scan_flops,
)


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
    Initialisation follows mamba-ssm's `Mamba`. Where the scan reads sequences backwards itself (`triton`), the
    backward direction runs on the unflipped x and z, its conv anti-causal, and nothing is flipped; elsewhere x, z
    and the output are flipped as Vim does. Both give the same result (tests/test_selective_scan_triton.py).

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
        """Depthwise conv, padded d_conv - 1 on both sides; `_direction` crops the right end to make it causal."""
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
        """One direction of the block on x, z of shape (B, d_inner, L); returns the gated scan output, same shape.

        `reverse` runs the direction from the last token to the first without flipping: the conv becomes
        anti-causal (Vim's causal conv of the flipped sequence, flipped back, is the conv with its taps reversed
        and the left padding cropped) and the scan reads the sequence backwards.
        """
        length = x.shape[-1]
        if reverse:
            x = F.conv1d(x, conv1d.weight.flip(-1), conv1d.bias, padding=self.d_conv - 1, groups=self.d_inner)
            x = F.silu(x[..., self.d_conv - 1 :])  # (B, d_inner, L): anti-causal, the left padding cropped
        else:
            x = F.silu(conv1d(x)[..., :length])  # (B, d_inner, L): causal, the right padding cropped
        x_dbl = x_proj(rearrange(x, "b d l -> b l d"))  # (B, L, dt_rank + 2 N)
        dt, B, C = torch.split(x_dbl, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        # dt_proj's bias is applied inside the scan (before softplus), as Mamba does.
        # Contiguous along L, once here: the kernels read each (channel, state) row along L (the Triton scan's
        # coalesced tiles assume it) and would otherwise copy or stride per access.
        delta = rearrange(F.linear(dt, dt_proj.weight), "b l d -> b d l").contiguous()  # (B, d_inner, L)
        B = rearrange(B, "b l n -> b n l").contiguous()  # (B, N, L)
        C = rearrange(C, "b l n -> b n l").contiguous()  # (B, N, L)
        y, self.impl = selective_scan(
            x,
            delta,
            -torch.exp(_scan_param(A_log)),
            B,
            C,
            _scan_param(D),
            z,
            delta_bias=_scan_param(dt_proj.bias),
            delta_softplus=True,
            impl=self.scan_impl,
            reverse=reverse,
        )
        return y

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """Mixes `x` (B, N, C) over its N tokens in row-major grid order; the grid shape is otherwise unused."""
        check_tokens(x, grid)
        xz = rearrange(self.in_proj(x), "b l d -> b d l")  # (B, 2 d_inner, L)
        x_in, z = xz.chunk(2, dim=1)  # (B, d_inner, L) each
        y_fwd = self._direction(x_in, z, self.conv1d, self.x_proj, self.dt_proj, self.A_log, self.D)
        backward = (self.conv1d_b, self.x_proj_b, self.dt_proj_b, self.A_b_log, self.D_b)
        if resolve_scan_impl(self.scan_impl, x_in.device, x_in.dtype) in NATIVE_REVERSE_IMPLS:
            y_bwd = self._direction(x_in, z, *backward, reverse=True)
        else:
            y_bwd = self._direction(x_in.flip(-1), z.flip(-1), *backward).flip(-1)
        y = (y_fwd + y_bwd) / 2  # (B, d_inner, L)
        return self.out_proj(rearrange(y, "b d l -> b l d"))  # (B, L, C)

    def macs(self, grid: Grid) -> int:
        """Forward MACs for one image: projections, both convs, both scans (4.5 L D N each).

        The conv runs with padding d_conv - 1 on both sides and its last d_conv - 1 outputs are cropped, so it
        computes L + d_conv - 1 outputs, each d_conv MACs per channel; biases and element-wise work are not counted.
        """
        L = grid[0] * grid[1]
        d_inner, N = self.d_inner, self.d_state
        in_proj = L * self.dim * 2 * d_inner
        conv = (L + self.d_conv - 1) * self.d_conv * d_inner
        x_proj = L * d_inner * (self.dt_rank + 2 * N)
        dt_proj = L * self.dt_rank * d_inner
        scan = selective_scan_flops(1, d_inner, L, N) // 2
        out_proj = L * d_inner * self.dim
        return in_proj + out_proj + 2 * (conv + x_proj + dt_proj + scan)
