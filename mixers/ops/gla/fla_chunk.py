"""fla's chunked GLA kernels (flash-linear-attention, pure Triton, `pip install -e ".[fla]"`), the GPU fast path
beside `chunk.py`'s PyTorch form, which stays the reference and the fallback.

fla's `chunk_gla` is causal like `chunk_gla` here; it takes `(B, T, H, K)` tensors (releases before 0.2 took
`(B, H, T, K)` by default, hence `head_first=False` where the signature still has it) and returns `(o, final_state)`.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
from einops import rearrange
from torch import Tensor


@functools.cache
def _fla_chunk_gla() -> Callable | None:
    """fla's `chunk_gla` where `fla` imports, else None; any import failure (a Triton without a GPU driver, API
    drift) counts as absent, so the PyTorch form runs."""
    try:
        from fla.ops.gla import chunk_gla
    except Exception:  # noqa: BLE001 - absent or broken: fall back, never fail the point
        return None
    return chunk_gla


def fla_unavailable_reason(device: torch.device) -> str | None:
    """Why fla's kernels cannot run on `device` (one line), or None where they can."""
    if device.type != "cuda":
        return f"fla's GLA kernels are Triton for CUDA; this runs on {device.type}"
    if _fla_chunk_gla() is None:
        return 'flash-linear-attention is not installed or does not import (pip install -e ".[fla]")'
    return None


def fla_chunk_gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float | None = None) -> Tensor:
    """Causal GLA through fla's chunked kernels; arguments and result in `chunk.chunk_gla`'s layout.

    Args:
        q: queries (B, H, L, K).
        k: keys (B, H, L, K).
        v: values (B, H, L, V).
        g: log forget gates (B, H, L, K), <= 0.
        scale: multiplies q; None gives K ** -0.5.

    Returns:
        o (B, H, L, V) in v's dtype.
    """
    kernel = _fla_chunk_gla()
    if kernel is None:
        raise RuntimeError(fla_unavailable_reason(q.device) or "fla is not available")
    q, k, v, g = (rearrange(t, "b h l d -> b l h d").contiguous() for t in (q, k, v, g))  # (B, L, H, K or V)
    options = {"head_first": False} if "head_first" in inspect.signature(kernel).parameters else {}
    o, _ = kernel(q, k, v, g, scale=scale, output_final_state=False, **options)
    return rearrange(o, "b l h d -> b h l d")  # (B, H, L, V)
