"""RMSNorm over groups of channels, times a weight and a silu gate, in PyTorch ops: the reference of the compiled
pass, and what runs where it does not (GPUs, half types, no compiler)."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def rms_norm_gated_reference(x: Tensor, weight: Tensor, z: Tensor, eps: float, group_size: int) -> Tensor:
    """`rms_norm_gated`'s definition: each group of `group_size` channels of x divided by its root mean square (eps
    added to the mean square), times `weight` (the same for every group), times silu(z)."""
    groups = x.shape[-1] // group_size
    normed = F.rms_norm(x.unflatten(-1, (groups, group_size)), (group_size,), weight, eps).flatten(-2)
    return normed * F.silu(z)
