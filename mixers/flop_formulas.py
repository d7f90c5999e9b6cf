"""FLOP formulas that `torch.utils.flop_counter.FlopCounterMode` lacks in some torch releases.

Counting must not depend on the torch release (tests/test_measure.py, tests/test_mixer_contract.py check every
built-in mixer against its analytic `macs`). Where a release has no formula for an op our mixers reach, the op
counts zero FLOPs silently, so we register one here, on import of `mixers`, before any counter is created:

- `aten._scaled_dot_product_flash_attention_for_cpu` and its backward: the CPU flash kernel that
  `F.scaled_dot_product_attention` dispatches to on real CPU tensors (fp32/bf16, no mask that needs a grad).
  torch 2.14.1 has no formula for it (pytorch issue 195460): attention counted 0 FLOPs on CPU tensors while the
  meta device, which decomposes SDPA into `bmm`, counted correctly. torch 2.15.0 registers it itself.

A formula is registered only where the release has none, so a release that fixes the op keeps its own.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import flop_registry, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _missing(*names: str) -> list:
    """The aten op packets of `names` that this torch release defines but has no FLOP formula for."""
    return [getattr(aten, name) for name in names if hasattr(aten, name) and getattr(aten, name) not in flop_registry]


def _cpu_flash_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """QK^T and AV, as for the other SDPA kernels: 2 x B x H x Lq x Lk x (E + Ev)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                             **kwargs) -> int:
    """The scores recomputed, then the gradients of AV and QK^T: as the other SDPA kernels' backward."""
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


REGISTERED: list = []  # the ops this module gave a formula to in this torch release (tests and provenance read it)

for _ops, _formula in (
    (_missing("_scaled_dot_product_flash_attention_for_cpu"), _cpu_flash_flop),
    (_missing("_scaled_dot_product_flash_attention_for_cpu_backward"), _cpu_flash_backward_flop),
):
    if _ops:
        register_flop_formula(_ops)(_formula)
        REGISTERED += _ops
