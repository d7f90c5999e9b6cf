"""Mamba-2 (Dao & Gu, "Transformers are SSMs", ICML 2024) made bidirectional as Hydra makes it (Hwang et al.,
"Hydra: Bidirectional State Space Models Through Generalized Matrix Mixers", 2024), on the chunked SSD kernel in
`mixers/ops/ssd`."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .base import Grid, TokenMixer, check_tokens
from .ops.norm_gate import rms_norm_gated
from .ops.precision import autocast_off
from .ops.gated_recurrence import unavailable_reason as cpp_unavailable_reason
from .ops.ssd import chunk_ssd, chunk_ssd_macs, ssd_hydra_cpp
from .ops.token_conv import depthwise_conv_tokens, depthwise_conv_tokens_macs
from .registry import register_mixer

MAMBA2_IMPLS = ("auto", "chunk_torch", "cpp_loop")


@register_mixer("mamba2")
class HydraMixer(TokenMixer):
    """Mamba-2's SSD over the row-major token sequence, both ways, as Hydra's quasiseparable matrix mixer.

    Why Hydra rather than Vim's pair of scans (the recipe of `mamba` and `gla` here): Hydra is the bidirectional form
    written for SSD by its authors' group, and its mixing matrix is one quasiseparable matrix: the strictly lower
    triangle is the forward SSD shifted by one token, the strictly upper the backward SSD shifted likewise, and the
    diagonal a separate, input-dependent weight per head (`fc_D(x) + D`). A sum of two causal scans (Vim, ViG)
    counts each token's own contribution twice through two coupled terms; Hydra's diagonal is free. It costs what
    Vim's pair costs: both directions come out of the one `in_proj` and the one conv, and run as one SSD call (the
    compiled loop walks the backward one from the end; the chunked form takes the flipped sequence stacked onto the
    batch). With `mamba` on Vim's recipe the suite has both recipes; a mamba2-vs-mamba difference is SSD with
    Hydra against Mamba-1 with Vim, not the SSM alone.

    Layout (Hydra's `Hydra` module, on Mamba-2's `Mamba2Simple`): `in_proj` gives the gate z, x, B and C for each
    direction, and dt for each direction; a depthwise conv of odd width, centred (non-causal, as Hydra), with silu,
    over x and the four B/C maps; dt = softplus(dt + dt_bias) with dt_bias, A = -exp(A_log) shared by the
    directions; the SSD with one scalar decay per head (B and C shared by the heads, one group); the two outputs
    shifted by one token so neither includes the token itself; plus x (fc_D(x) + D) per head; an RMSNorm over the
    inner width, times silu(z) (Hydra normalises before gating); `out_proj`. Initialisation as Hydra: A = 1 for
    every head, dt log-uniform in [dt_min, dt_max], D = 1. The SSD runs in float32 (float64 for float64 inputs),
    with autocast off, through one of two implementations, recorded in `impl`: `chunk_torch` (`chunk_ssd`, plain
    PyTorch, any device: the reference and the fallback) or `cpp_loop` (`ssd_hydra_cpp`: both directions as one
    compiled loop on the CPU, forward and backward, the backward one walked from the sequence's end so nothing is
    flipped, x = u dt formed in the loop and the one-token shifts in its buffers' strides; where a C++ compiler is
    found). MACs are the chunked form's at `chunk_size` whichever runs; while `torch.jit.trace` runs (fvcore's
    count) `chunk_torch` stands in, since fvcore sees no products inside the compiled loop.

    Parameters: with expand 1 and d_state = dim / 4 (the defaults), the in/out projections hold 4 dim^2 + 2 dim H
    against attention's 4 dim^2 + 4 dim, plus the conv, fc_D and norm: tests/test_mamba2.py pins the counts
    within 5% of attention's at the micro and tiny presets. Heads: `num_heads` (attention's), unless `headdim`
    is given.

    Args:
        dim: token channels C (Mamba's `d_model`).
        num_heads: SSD heads H when `headdim` is None.
        layer_idx: unused.
        d_state: state size N per head; None gives max(1, dim // 4), which matches attention's parameters.
        d_conv: width of the centred depthwise conv; odd, so the output keeps the sequence's length.
        expand: d_inner = expand * dim, the scanned channels.
        headdim: channels P per head; None gives d_inner // num_heads.
        dt_min: smallest initial step size.
        dt_max: largest initial step size.
        dt_init_floor: floor of the initial step size.
        conv_bias: bias on the conv.
        bias: bias on in_proj and out_proj.
        chunk_size: steps per chunk of `chunk_ssd`. On a CPU the (T x T) decay matrices are element-wise work of
            T per token and head beside the products, so chunks shorter than the GPU kernels' 256 run faster; 32
            beat 16 and 64 at the micro and tiny presets (experiments.bench.mixers, indicative).
        norm_eps: epsilon of the RMSNorm.
        impl: `auto` (cpp_loop on the CPU where it builds, chunk_torch otherwise), `chunk_torch` or `cpp_loop` (an
            error where it cannot run; on the meta device, which runs no kernel, chunk_torch).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        layer_idx: int = 0,
        d_state: int | None = None,
        d_conv: int = 3,
        expand: int = 1,
        headdim: int | None = None,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        conv_bias: bool = True,
        bias: bool = False,
        chunk_size: int = 32,
        norm_eps: float = 1e-5,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        d_inner = expand * dim
        headdim = d_inner // num_heads if headdim is None else headdim
        if expand < 1 or headdim < 1 or d_inner % headdim:
            raise ValueError(f"mamba2: expand * dim = {d_inner} must be a positive multiple of headdim={headdim}; "
                             "choose expand and headdim (or num_heads) so that it is")
        if d_conv < 1 or d_conv % 2 == 0:
            raise ValueError(f"mamba2: d_conv must be odd (a centred conv keeps the length), got {d_conv}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"mamba2: need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        if impl not in MAMBA2_IMPLS:
            raise ValueError(f"mamba2: unknown impl {impl!r}; choose one of {', '.join(MAMBA2_IMPLS)}")
        if chunk_size < 1 or (d_state is not None and d_state < 1):
            raise ValueError(f"mamba2: chunk_size and d_state must be >= 1, got {chunk_size}, {d_state}")
        self.dim = dim
        self.d_inner = d_inner
        self.headdim = headdim
        self.nheads = d_inner // headdim
        self.d_state = max(1, dim // 4) if d_state is None else d_state
        self.d_conv = d_conv
        self.chunk_size = chunk_size
        self.norm_eps = norm_eps
        self.requested_impl = impl
        self.impl = "not_run"

        N, H = self.d_state, self.nheads
        # Order: z, x, (B, C) forward, (B, C) backward, dt forward, dt backward.
        self.in_proj = nn.Linear(dim, 2 * d_inner + 4 * N + 2 * H, bias=bias)
        conv_dim = d_inner + 4 * N
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, d_conv, padding=d_conv // 2, groups=conv_dim, bias=conv_bias)
        self.dt_bias = nn.Parameter(self._dt_bias_init(dt_min, dt_max, dt_init_floor))
        self.dt_bias._no_weight_decay = True
        self.A_log = nn.Parameter(torch.zeros(H))  # A = -exp(0) = -1 for every head, Hydra's init
        self.A_log._no_weight_decay = True
        self.D = nn.Parameter(torch.ones(H))
        self.D._no_weight_decay = True
        self.fc_D = nn.Linear(d_inner, H, bias=False)
        self.norm_weight = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, dim, bias=bias)

    def _dt_bias_init(self, dt_min: float, dt_max: float, dt_init_floor: float) -> Tensor:
        """softplus^-1(dt) with dt log-uniform in [dt_min, dt_max], floored (Mamba's dt init), one per head."""
        dt = torch.exp(torch.rand(self.nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        return dt + torch.log(-torch.expm1(-dt))  # softplus(inv_dt) == dt

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, d_inner={self.d_inner}, nheads={self.nheads}, d_state={self.d_state}, "
                f"d_conv={self.d_conv}, chunk_size={self.chunk_size}")

    def _resolve_impl(self, device: torch.device) -> str:
        if self.requested_impl == "chunk_torch" or device.type == "meta":
            return "chunk_torch"
        reason = cpp_unavailable_reason(device)
        if reason is None:
            return "cpp_loop"
        if self.requested_impl == "cpp_loop":
            raise RuntimeError(f"mamba2: impl='cpp_loop' cannot run here: {reason}; use impl='auto' or "
                               "'chunk_torch'")
        return "chunk_torch"

    def _off_diagonal(self, impl: str, u: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        """Hydra's strictly lower and upper parts applied to u (B, L, H, P): the other inputs (2, B, L, ...),
        direction 0 causal and direction 1 anti-causal (from the last token back), each the SSD of x = u dt; at
        token t direction 0's SSD at t - 1 plus direction 1's at t + 1, so the token itself enters only through the
        diagonal. (B, L, H, P)."""
        if impl == "cpp_loop":  # one call of the compiled loop: u dt formed in it, the shifts its buffers' strides
            return ssd_hydra_cpp(u, dt, a, b, c, chunk_size=self.chunk_size)
        # The chunked form: the backward direction as the causal SSD of the flipped sequence, stacked onto the
        # batch, so one call runs both.
        x = u * dt[..., None]  # (2, B, L, H, P)
        y = chunk_ssd(*(torch.cat([t[0], t[1].flip(1)]) for t in (x, a, b, c)), chunk_size=self.chunk_size)
        y_fwd, y_bwd = y[: x.shape[1]], y[x.shape[1]:].flip(1)
        return F.pad(y_fwd[:, :-1], (0, 0, 0, 0, 1, 0)) + F.pad(y_bwd[:, 1:], (0, 0, 0, 0, 0, 1))

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """Mixes `x (B, H * W, C)` over its tokens in row-major grid order, both ways; the grid is otherwise unused."""
        check_tokens(x, grid)
        N, H = self.d_state, self.nheads
        compute = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for float64 tests
        z, xbc, dt = torch.split(self.in_proj(x), [self.d_inner, self.d_inner + 4 * N, 2 * H], dim=-1)
        # The centred conv on the time-major rows as they come (no channel-major copies, see mixers/ops/token_conv).
        xbc = depthwise_conv_tokens(xbc, self.conv1d.weight, self.conv1d.bias, self.d_conv // 2, silu=True)
        u, bc = torch.split(xbc, [self.d_inner, 4 * N], dim=-1)  # (B, L, d_inner), (B, L, 4N)
        # The two directions on a leading axis, as views: B and C of each (forward, backward), and dt of each.
        bc = bc.unflatten(-1, (2, 2, N)).movedim(2, 0).to(compute)  # (2, B, L, {B, C}, N)
        b, c = bc[..., 0, :], bc[..., 1, :]  # (2, B, L, N) each
        with autocast_off(x.device.type):
            dt = dt.unflatten(-1, (2, H)).movedim(2, 0).to(compute)  # (2, B, L, H)
            dt = F.softplus(dt + self.dt_bias.to(compute))
            A = -torch.exp(self.A_log.to(compute))  # (H,)
            u_heads = rearrange(u.to(compute), "b l (h p) -> b l h p", h=H)  # (B, L, H, P)
            impl = self._resolve_impl(x.device)
            if impl != "chunk_torch" and torch.jit.is_tracing():
                impl = "chunk_torch"  # what fvcore can count; the measured calls record what they ran
            else:
                self.impl = impl
            off_diagonal = self._off_diagonal(impl, u_heads, dt, dt * A, b, c)  # (B, L, H, P)
        # The diagonal: each token's own x, weighted per head by fc_D(x) + D.
        diag = F.linear(u.to(compute), self.fc_D.weight.to(compute), self.D.to(compute))  # (B, L, H)
        mixed = u_heads * diag[..., None] + off_diagonal  # (B, L, H, P)
        y = rearrange(mixed, "b l h p -> b l (h p)")  # (B, L, d_inner)
        y = rms_norm_gated(y, self.norm_weight.to(compute), z.to(compute), self.norm_eps)  # the norm, then the gate
        return self.out_proj(y.to(x.dtype))

    def macs(self, grid: Grid) -> int:
        """Forward MACs for one image: in/out projections, the conv, fc_D, and the SSD of both directions
        (`chunk_ssd_macs`, on the sequence padded to whole chunks). Norm, gates, softplus and exps are element-wise.

        The centred conv of odd width computes exactly L outputs, d_conv MACs each per channel.
        """
        L, C, N, H = grid[0] * grid[1], self.dim, self.d_state, self.nheads
        in_proj = L * C * (2 * self.d_inner + 4 * N + 2 * H)
        conv = depthwise_conv_tokens_macs(1, L, self.d_inner + 4 * N, self.d_conv)
        fc_D = L * self.d_inner * H
        ssd = chunk_ssd_macs(L, H, self.headdim, N, self.chunk_size)
        out_proj = L * self.d_inner * C
        return in_proj + conv + fc_D + 2 * ssd + out_proj
