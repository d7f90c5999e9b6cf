"""Global multi-head self-attention through PyTorch's fused SDPA kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import trunc_normal_
from torch import Tensor, nn

from .base import Grid, TokenMixer, check_bool_option, check_tokens
from .registry import register_mixer

# torch._fused_sdp_choice returns the SDPBackend enum's integer; these are the names we record as `impl`.
_SDPA_BACKENDS = {0: "sdpa_math", 1: "sdpa_flash", 2: "sdpa_efficient", 3: "sdpa_cudnn", 4: "sdpa_overrideable"}


def sdpa_backend_name(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None) -> str:
    """Name of the backend `F.scaled_dot_product_attention` picks for these inputs under the current settings.

    `torch._fused_sdp_choice` is private but cheap (about a microsecond) and honours `sdpa_kernel` contexts.
    """
    if torch.jit.is_tracing():  # the counters trace the model; the label is not part of the graph
        return "sdpa"
    try:
        choice = torch._fused_sdp_choice(q, k, v, attn_mask)
    except (AttributeError, RuntimeError, TypeError):  # private API: keep a usable label if it moves
        return "sdpa"
    return _SDPA_BACKENDS.get(int(choice), "sdpa")


def qkv_and_proj(dim: int, qkv_bias: bool) -> tuple[nn.Linear, nn.Linear]:
    """The fused q, k, v projection and the output projection of every attention-like mixer.

    One initialisation (ViT's truncated normal, std 0.02, zero biases) for all of them, so accuracy differences
    between mixers do not come from how their projections started.
    """
    qkv, proj = nn.Linear(dim, 3 * dim, bias=qkv_bias), nn.Linear(dim, dim)
    for linear in (qkv, proj):
        trunc_normal_(linear.weight, std=0.02)
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)
    return qkv, proj


@register_mixer("attention")
class Attention(TokenMixer):
    """Global multi-head self-attention: every token attends to every token, O(N^2 C) time.

    Runs `F.scaled_dot_product_attention`, so the device picks a flash, memory-efficient, cuDNN or math kernel;
    `impl` records which. `attention_naive` subclasses this with the N x N matrix materialised, so both share
    one state dict.

    Args:
        dim: token channels C.
        num_heads: heads; `dim` must be divisible by it.
        layer_idx: unused (global attention is the same at every depth).
        qkv_bias: bias on the fused q, k, v projection, as ViT/DeiT.
    """

    def __init__(self, dim: int, num_heads: int, *, layer_idx: int = 0, qkv_bias: bool = True) -> None:
        super().__init__()
        # Types and ranges first (issue 35): a TOML `true` or a 0 would otherwise build a degenerate mixer.
        check_bool_option("attention", "qkv_bias", qkv_bias)
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv, self.proj = qkv_and_proj(dim, qkv_bias)
        self.impl = "sdpa"

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v of shape (B, heads, N, head_dim) from tokens (B, N, C)."""
        qkv = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
        return qkv[0], qkv[1], qkv[2]

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(d)) v for (B, heads, N, head_dim) inputs."""
        self.impl = sdpa_backend_name(q, k, v)
        return F.scaled_dot_product_attention(q, k, v)

    def forward(self, x: Tensor, grid: Grid) -> Tensor:
        check_tokens(x, grid)
        q, k, v = self.project_qkv(x)
        out = self.attend(q, k, v)  # (B, heads, N, head_dim)
        return self.proj(rearrange(out, "b h n d -> b n (h d)"))

    def macs(self, grid: Grid) -> int:
        n, c = grid[0] * grid[1], self.dim
        projections = 4 * n * c * c  # qkv (3 N C^2) + proj (N C^2)
        scores_and_mix = 2 * n * n * c  # q k^T and attn @ v, summed over heads
        return projections + scores_and_mix
