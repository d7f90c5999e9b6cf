"""Non-causal kernelised linear attention (Katharopoulos et al., 2020)."""
from __future__ import annotations

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from .attention import qkv_and_proj
from .base import Grid, TokenMixer, check_bool_option, check_positive_option, check_tokens
from .ops.precision import autocast_off
from .registry import register_mixer


def elu_plus_one(x: Tensor) -> Tensor:
    """The positive feature map of Katharopoulos et al.: phi(x) = elu(x) + 1 > 0."""
    return F.elu(x) + 1.0


FEATURE_MAPS = {"elu": elu_plus_one, "relu": F.relu}


@register_mixer("linear")
class LinearAttention(TokenMixer):
    """Multi-head linear attention: out_i = phi(q_i) (sum_j phi(k_j)^T v_j) / (phi(q_i) . sum_j phi(k_j)).

    Reassociating the product costs O(N C d) instead of O(N^2 C) and never forms an N x N matrix. The key-value
    state and the normaliser are means over tokens kept in float32, because plain sums in fp16/bf16 overflow or
    lose precision at large N; the ratio is unchanged by using means.

    Args:
        dim: token channels C.
        num_heads: heads; `dim` must be divisible by it.
        layer_idx: unused.
        feature_map: `elu` (elu + 1, the paper's) or `relu`.
        eps: guards the normaliser against division by zero.
        qkv_bias: bias on the fused q, k, v projection.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        layer_idx: int = 0,
        feature_map: str = "elu",
        eps: float = 1e-6,
        qkv_bias: bool = True,
    ) -> None:
        super().__init__()
        # Types and ranges first (issue 35): a TOML `true` or a 0 would otherwise build a degenerate mixer.
        check_positive_option("linear", "eps", eps)
        check_bool_option("linear", "qkv_bias", qkv_bias)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"linear: unknown feature_map {feature_map!r}; choose one of {sorted(FEATURE_MAPS)}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.feature_map = FEATURE_MAPS[feature_map]
        self.eps = eps
        self.qkv, self.proj = qkv_and_proj(dim, qkv_bias)
        self.impl = "linear_fp32_state"

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        check_tokens(x, grid)
        qkv = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        out_dtype = qkv.dtype
        # Autocast would cast these matmuls back to bf16/fp16; the state must stay float32.
        with autocast_off(x.device.type):
            q, k = self.feature_map(qkv[0].float()), self.feature_map(qkv[1].float())  # (B, heads, N, head_dim)
            v = qkv[2].float()
            n = x.shape[1]
            # Plain matmuls rather than einsum: einsum turns size-1 contractions into element-wise products,
            # which would make the work the counters see depend on the grid.
            kv = (k.transpose(-2, -1) @ v) / n  # (B, heads, head_dim, head_dim)
            k_mean = k.mean(dim=2, keepdim=True)  # (B, heads, 1, head_dim)
            numerator = q @ kv  # (B, heads, N, head_dim)
            normaliser = q @ k_mean.transpose(-2, -1)  # (B, heads, N, 1)
            out = (numerator / (normaliser + self.eps)).to(out_dtype)
        return self.proj(rearrange(out, "b h n d -> b n (h d)"))

    def macs(self, grid: Grid) -> int:
        n, c = grid[0] * grid[1], self.dim
        projections = 4 * n * c * c  # qkv (3 N C^2) + proj (N C^2)
        state = n * c * self.head_dim  # phi(K)^T V, per head N d^2
        readout = n * c * self.head_dim  # phi(Q) kv
        normaliser = n * c  # phi(Q) . mean(phi(K))
        return projections + state + readout + normaliser
