"""The token conv in PyTorch ops: K fused multiply-adds over shifted views of the padded input. The reference the
compiled form is tested against, and what runs where that one does not (no compiler, half types, GPUs)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def padded(x: Tensor, width: int, left: int) -> Tensor:
    """x (B, L, C) with `left` zero steps before and `width - 1 - left` after."""
    return F.pad(x, (0, 0, left, width - 1 - left))


def shifted_sum(x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool = False) -> Tensor:
    """The conv as K fused multiply-adds over shifted views of the padded input, then silu where `silu`."""
    width, length = weight.shape[-1], x.shape[1]
    taps = weight[:, 0, :].t()  # (K, C): a tap's channels adjacent, as x's
    x_padded = padded(x, width, left)  # (B, L + K - 1, C)
    first = x_padded[:, :length]
    out = first * taps[0] if bias is None else torch.addcmul(bias, first, taps[0])
    for k in range(1, width):
        out = torch.addcmul(out, x_padded[:, k : k + length], taps[k])
    return (F.silu(out) if silu else out).to(x.dtype)


def weight_grad(grad: Tensor, x: Tensor, weight: Tensor, left: int) -> Tensor:
    """The weight's gradient (C, 1, K): grad times x shifted by each tap, summed over B and L in at least the
    weight's precision."""
    width, length = weight.shape[-1], x.shape[1]
    x_padded = padded(x, width, left)
    wide = torch.promote_types(weight.dtype, grad.dtype)
    taps = [(grad * x_padded[:, k : k + length]).sum((0, 1), dtype=wide) for k in range(width)]  # (C,) each
    return torch.stack(taps, dim=-1).unsqueeze(1).to(weight.dtype)  # (C, 1, K)
