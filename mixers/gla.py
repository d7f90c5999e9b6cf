"""Bidirectional gated linear attention, ViG's BiGLA (Liao et al., "ViG: Linear-complexity Visual Sequence Learning
with Gated Linear Attention", 2024), on GLA (Yang et al., ICML 2024) in its chunked form (`mixers/ops/gla`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .base import Grid, TokenMixer, check_int_option, check_positive_option, check_tokens
from .ops.gated_recurrence import unavailable_reason as cpp_unavailable_reason
from .ops.gla import chunk_gla, chunk_gla_macs, fla_chunk_gla, fla_unavailable_reason, gla_both_ways_cpp
from .ops.norm_gate import rms_norm_gated
from .ops.precision import autocast_off
from .registry import register_mixer

GLA_IMPLS = ("auto", "chunk_torch", "cpp_loop", "fla")


def log_sigmoid(y: Tensor) -> Tensor:
    """log(sigmoid(y)), the forget gates' log decays: `F.logsigmoid` off the CPU; on it log(sigmoid(y)) for y > -80
    and y below (where the two differ by less than e^-80), without a kink at 0 or a NaN gradient far below it.

    ATen's CPU logsigmoid (and softplus) runs log1p, scalar and several times slower there than sigmoid, log and the
    comparison together: at the micro preset gla's two gates per block were the largest item of its training step's
    profile after the matmuls and the recurrence.
    Against float64's logsigmoid the float32 error is the same order as F.logsigmoid's own (tests/test_gla.py).
    """
    if y.device.type != "cpu":
        return F.logsigmoid(y)
    # the clamp keeps sigmoid off 0 in the branch `where` discards, whose gradient would otherwise be 0 / 0
    return torch.where(y > -80, torch.sigmoid(y.clamp(min=-80)).log(), y)


@register_mixer("gla")
class BiGLA(TokenMixer):
    """Gated linear attention over the row-major token sequence, forward and backward, summed.

    Shared `q_proj`, `k_proj` (to `expand_k * dim`), `v_proj`, output gate `g_proj` and `o_proj`, as fla's
    `GatedLinearAttention`; each direction has its own forget gate `gk_proj[0]` (forward) / `gk_proj[1]` (backward),
    a rank-`gate_low_rank_dim` projection to `logsigmoid(.) / gate_logit_normalizer`, ViG's direction-wise gating.
    The backward direction runs the causal GLA on the reversed sequence, in the same call as the forward one
    (stacked on the batch for the chunked forms, a second direction of the compiled loop). Both outputs include the
    token itself (the diagonal of each causal map), so it counts twice in the sum; then a per-head RMSNorm times
    swish(g), `o_proj`. ViG's 2D locality-injection conv is not part of this mixer. The recurrences run in float32
    through one of three implementations, recorded in `impl`: `chunk_torch` (`chunk_gla`, plain PyTorch, any
    device: the reference and the fallback), `cpp_loop` (`gla_both_ways_cpp`: both directions as one compiled loop
    on the CPU, forward and backward, the backward direction walked from the sequence's end so nothing is flipped;
    where a C++ compiler is found) or `fla_chunk` (fla's chunked Triton kernels, on CUDA where
    `flash-linear-attention` imports, `pip install -e ".[fla]"`; q, k, v stay in the autocast dtype there, the
    gates float32). The PyTorch form runs a Python loop over the chunks (L / chunk_size steps, a few kernels each);
    the others a few kernels in all. MACs are the chunked form's at `chunk_size` whichever runs. While
    `torch.jit.trace` runs (fvcore's count), `chunk_torch` stands in, since fvcore sees no products inside fla's
    autograd Function or the compiled loop.

    Where it departs from ViG (cite it as "ViG-style BiGLA", not as ViG's block): the two directions are summed
    where ViG averages them (a factor of 2 before the per-head RMSNorm, which removes it except through the norm's
    eps, so outputs differ slightly, most at initialisation); the output gate is fla's `GatedLinearAttention`'s
    (per-head RMSNorm times swish(g_proj(x))), not ViG's; and there is no locality-injection conv (above).

    Parameters: 4 dim^2 for the projections, as attention's, plus 2 x (dim r + r K + K) for the two forget gates
    (r = gate_low_rank_dim, K = expand_k * dim) and a head-sized norm weight, without the projection biases
    attention has: 18% above attention's count at the micro preset, 6% at tiny with the defaults;
    `gate_low_rank_dim=4` brings micro within 4%.

    Args:
        dim: token channels C.
        num_heads: heads; must divide `dim` and `expand_k * dim`.
        layer_idx: unused.
        expand_k: key (and query) width as a multiple of `dim` (fla's default 0.5).
        gate_low_rank_dim: rank r of each forget-gate projection.
        gate_logit_normalizer: divides logsigmoid of the gate logits, so decays start near 1 (fla's 16).
        chunk_size: steps per chunk of `chunk_gla`.
        norm_eps: epsilon of the output RMSNorm.
        impl: `auto` (fla on CUDA where it imports, cpp_loop on the CPU where it builds, chunk_torch otherwise),
            `chunk_torch`, `cpp_loop` or `fla` (an error where the one named cannot run; on the meta device, which
            runs no kernel, chunk_torch).
    """

    def __init__(self, dim: int, num_heads: int, *, layer_idx: int = 0, expand_k: float = 0.5,
                 gate_low_rank_dim: int = 16, gate_logit_normalizer: float = 16.0, chunk_size: int = 16,
                 norm_eps: float = 1e-5, impl: str = "auto") -> None:
        super().__init__()
        # Types and ranges first (issue 35): a TOML `true` or a 0 would otherwise build a degenerate mixer.
        check_positive_option("gla", "expand_k", expand_k)
        check_positive_option("gla", "gate_logit_normalizer", gate_logit_normalizer)
        check_positive_option("gla", "norm_eps", norm_eps)
        check_int_option("gla", "gate_low_rank_dim", gate_low_rank_dim)
        check_int_option("gla", "chunk_size", chunk_size)
        key_dim = int(dim * expand_k)
        if key_dim < num_heads or key_dim % num_heads:
            raise ValueError(f"gla: expand_k * dim = {key_dim} must be a positive multiple of num_heads="
                             f"{num_heads}; choose expand_k so that it is")
        if impl not in GLA_IMPLS:
            raise ValueError(f"gla: unknown impl {impl!r}; choose one of {', '.join(GLA_IMPLS)}")
        if chunk_size < 1 or gate_low_rank_dim < 1:
            raise ValueError(f"gla: chunk_size and gate_low_rank_dim must be >= 1, got {chunk_size}, "
                             f"{gate_low_rank_dim}")
        self.dim = dim
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.head_k_dim = key_dim // num_heads
        self.head_v_dim = dim // num_heads
        self.gate_low_rank_dim = gate_low_rank_dim
        self.gate_logit_normalizer = gate_logit_normalizer
        self.chunk_size = chunk_size
        self.norm_eps = norm_eps
        self.requested_impl = impl
        self.q_proj = nn.Linear(dim, key_dim, bias=False)
        self.k_proj = nn.Linear(dim, key_dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.g_proj = nn.Linear(dim, dim, bias=False)
        self.gk_proj = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, gate_low_rank_dim, bias=False), nn.Linear(gate_low_rank_dim, key_dim))
            for _ in range(2)
        )
        self.g_norm_weight = nn.Parameter(torch.ones(self.head_v_dim))
        self.o_proj = nn.Linear(dim, dim, bias=False)
        # fla's GLA init: xavier_uniform with gain 2^-2.5 on every linear weight, zero biases.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight, gain=2**-2.5)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        self.impl = "not_run"

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, key_dim={self.key_dim}, chunk_size={self.chunk_size}"

    def _resolve_impl(self, device: torch.device) -> str:
        if self.requested_impl == "chunk_torch" or device.type == "meta":
            return "chunk_torch"
        if self.requested_impl == "cpp_loop" or (self.requested_impl == "auto" and device.type == "cpu"):
            reason = cpp_unavailable_reason(device)
            if reason is None:
                return "cpp_loop"
        else:
            reason = fla_unavailable_reason(device)
            if reason is None:
                return "fla_chunk"
        if self.requested_impl != "auto":
            raise RuntimeError(f"gla: impl={self.requested_impl!r} cannot run here: {reason}; use impl='auto' or "
                               "'chunk_torch'")
        return "chunk_torch"

    def _causal(self, impl: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor) -> Tensor:
        """One causal GLA pass, (B, H, L, V)."""
        if impl == "fla_chunk":
            return fla_chunk_gla(q, k, v, g)
        return chunk_gla(q, k, v, g, chunk_size=self.chunk_size)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        """Mixes `x (B, H * W, C)` over its tokens in row-major grid order, both ways."""
        check_tokens(x, grid)
        heads = self.num_heads
        compute = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for float64 tests
        # Every projection of x (q, k, v, the output gate's input, both forget gates' first factor) in one matmul,
        # the weights kept apart under fla's names: at small N each matmul's fixed cost, forward and backward,
        # outweighs its arithmetic (issue 33).
        inputs = (self.q_proj, self.k_proj, self.v_proj, self.g_proj, self.gk_proj[0][0], self.gk_proj[1][0])
        projected = F.linear(x, torch.cat([p.weight for p in inputs]))  # (B, L, sum of their widths)
        q, k, v, gate, *low_rank = projected.split([p.out_features for p in inputs], dim=-1)
        q, k, v = (rearrange(t, "b l (h d) -> b h l d", h=heads) for t in (q, k, v))  # (B, H, L, K|K|V)
        gates = [rearrange(log_sigmoid(p[1](r).to(compute)) / self.gate_logit_normalizer, "b l (h d) -> b h l d",
                           h=heads) for p, r in zip(self.gk_proj, low_rank)]  # 2 x (B, H, L, K), log decays <= 0
        # gate: (B, L, C), the output gate's input, under autocast where it runs
        impl = self._resolve_impl(x.device)
        if impl != "chunk_torch" and torch.jit.is_tracing():
            impl = "chunk_torch"  # what fvcore can count; the measured calls record what they ran
        else:
            self.impl = impl
        with autocast_off(x.device.type):  # the GLA state must stay float32
            if impl == "cpp_loop":  # both directions in one call, the backward one walked from the end: no copies
                o = gla_both_ways_cpp(q, k, v, *gates, chunk_size=self.chunk_size).to(compute)  # (B, H, L, V)
            else:
                # Both directions in one pass, the backward one as the forward one over flipped sequences stacked on
                # the batch: each op of the chunked form runs once on twice the rows instead of twice (at small N
                # its fixed cost per op, not its arithmetic, is most of the time).
                both = [torch.cat([t, t.flip(2)]) for t in (q, k, v)] + [torch.cat([gates[0], gates[1].flip(2)])]
                o = self._causal(impl, *both).to(compute)  # (2B, H, L, V)
                o = o[: x.shape[0]] + o[x.shape[0]:].flip(2)  # (B, H, L, V)
            o = rearrange(o, "b h l d -> b l (h d)")  # (B, L, C)
            # Each head's output normalised (RMS over its V channels), then gated: fla's FusedRMSNormSwishGate.
            o = rms_norm_gated(o, self.g_norm_weight.to(compute), gate.to(compute), self.norm_eps,
                               group_size=self.head_v_dim)
        return self.o_proj(o.to(x.dtype))

    def macs(self, grid: Grid) -> int:
        """Forward MACs for one image: the projections, both forget gates and both chunked GLAs
        (`chunk_gla_macs`, on the sequence padded to whole chunks). Norm, gates and exps are element-wise."""
        L, C, K, r = grid[0] * grid[1], self.dim, self.key_dim, self.gate_low_rank_dim
        projections = L * C * (2 * K + 3 * C)
        forget_gates = 2 * L * (C * r + r * K)
        gla = chunk_gla_macs(self.num_heads, L, self.head_k_dim, self.head_v_dim, self.chunk_size)
        return projections + forget_gates + 2 * gla
