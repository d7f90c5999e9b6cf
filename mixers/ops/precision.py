"""Precision guards that kernels share."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor


def compute_dtype(t: Tensor) -> torch.dtype:
    """The dtype a recurrence accumulates in for inputs like `t`: float64 stays float64 (for tight tests), every
    other (float32, the half types) accumulates in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def autocast_off(device_type: str) -> AbstractContextManager:
    """A context that turns autocast off where it is on, so a recurrence's state and decays stay float32 under
    mixed-precision training (a bf16 decay product loses the state within a few steps)."""
    on = torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
    return torch.autocast(device_type, enabled=False) if on else nullcontext()
