"""Precision guards that kernels share."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch


def autocast_off(device_type: str) -> AbstractContextManager:
    """A context that turns autocast off where it is on, so a recurrence's state and decays stay float32 under
    mixed-precision training (a bf16 decay product loses the state within a few steps)."""
    on = torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
    return torch.autocast(device_type, enabled=False) if on else nullcontext()
