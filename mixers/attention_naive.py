"""Global attention with the N x N matrix materialised: the baseline many papers' quadratic wall measured."""
from __future__ import annotations

from torch import Tensor

from .attention import Attention
from .registry import register_mixer


@register_mixer("attention_naive")
class NaiveAttention(Attention):
    """Same module and weights as `attention`, but computes softmax(QK^T / sqrt(d)) V explicitly.

    The (B, heads, N, N) score and probability matrices are held in memory, so this mixer shows the memory
    wall that fused kernels (flash, memory-efficient) remove while the arithmetic stays the same.
    """

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        self.impl = "naive"
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
        return scores.softmax(dim=-1) @ v  # (B, heads, N, head_dim)
