"""When a test may call a value non-zero: far above the round-off of the computation that produced it.

A gradient that exists only through round-off (the sum of a LayerNorm's outputs, a cancelled path) is about
`eps` times the scale of the values around it, and whether it is 0, tiny or a few ulps differs between CPUs and
torch releases. So reach tests compute in float64 and ask for a value many orders above float64 round-off of the
largest gradient in the same backward pass: a real path clears it by orders of magnitude (the smallest real one
here, a Vim dt_proj weight at initialisation, is ~7e-7 of the largest), a round-off one cannot.
"""
from __future__ import annotations

import torch
from torch import Tensor

MARGIN = 1e6  # orders above eps: 2.2e-10 of the reference in float64


def clearly_non_zero(value: Tensor, reference: float) -> bool:
    """Whether the largest |value| stands MARGIN x eps above `reference` (the largest |gradient| beside it).

    Args:
        value: a float64 tensor (a gradient).
        reference: the scale round-off is relative to, e.g. the largest |gradient| of the same backward pass.
    """
    if value.dtype != torch.float64:
        raise TypeError(f"compute reach tests in float64, got {value.dtype}: float32 round-off is too coarse")
    return value.abs().max().item() > MARGIN * torch.finfo(torch.float64).eps * reference


def largest(tensors: list[Tensor]) -> float:
    """The largest |entry| over `tensors`: the reference scale of one backward pass."""
    return max(t.abs().max().item() for t in tensors)
