"""Counting multiply-accumulates with the two counters people use, so the analytic formulas can be checked.

fvcore counts MACs but silently skips `scaled_dot_product_attention` and cannot see inside custom ops, and it
counts norms, which our convention does not: it gets handles for all three. torch's FlopCounterMode counts FLOPs
(2 per MAC), sees SDPA, and counts custom ops by formulas registered with the op (mixers/ops/selective_scan/).
Convention (results/README.md): matmul-like work only (linear, matmul, bmm, conv, attention's QK^T and AV, the
selective scan by its formula); softmax, norms and element-wise ops are not counted.
"""
from __future__ import annotations

import math
import warnings

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from mixers.base import CUSTOM_OP_MACS

# fvcore's default handles that count work our convention leaves out.
_NOT_COUNTED = (
    "aten::layer_norm",
    "aten::batch_norm",
    "aten::group_norm",
    "aten::instance_norm",
    "aten::upsample_nearest2d",
    "aten::upsample_bilinear2d",
    "aten::adaptive_avg_pool2d",
    "aten::grid_sampler",
)


def _shape(value: torch._C.Value) -> tuple[int, ...] | None:
    kind = value.type()
    return tuple(kind.sizes()) if isinstance(kind, torch._C.TensorType) and kind.sizes() is not None else None


def sdpa_macs(inputs: list, outputs: list) -> int:
    """fvcore handle: q k^T and attn v of `scaled_dot_product_attention`, (..., L, E) x (..., S, E) x (..., S, Ev)."""
    q, k, v = (_shape(inputs[i]) for i in range(3))
    batch_heads_queries = math.prod(q[:-1])
    return batch_heads_queries * k[-2] * (q[-1] + v[-1])


def _custom_op_handle(formula):
    return lambda inputs, outputs: formula([_shape(value) for value in inputs])


def fvcore_macs(model: nn.Module, example: torch.Tensor) -> int:
    """MACs of `model(example)` counted by fvcore's FlopCountAnalysis (a jit trace), with our handles."""
    with warnings.catch_warnings(), torch.no_grad():
        # fvcore's import and jit tracing warn about torch.jit's deprecation and Python control flow: expected.
        warnings.simplefilter("ignore")
        from fvcore.nn import FlopCountAnalysis

        analysis = FlopCountAnalysis(model, example).unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        analysis.set_op_handle("aten::scaled_dot_product_attention", sdpa_macs)
        for name in _NOT_COUNTED:
            analysis.set_op_handle(name, lambda inputs, outputs: 0)
        for name, formula in CUSTOM_OP_MACS.items():
            analysis.set_op_handle(name, _custom_op_handle(formula))
        return int(analysis.total())


def flop_counter_flops(model: nn.Module, example: torch.Tensor) -> int:
    """FLOPs of `model(example)` counted by torch.utils.flop_counter.FlopCounterMode (works on the meta device)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(example)
    return int(counter.get_total_flops())


def flop_counter_train_flops(model: nn.Module, example: torch.Tensor, target: torch.Tensor) -> int:
    """FLOPs of one training step's forward and backward (cross-entropy on `target`), counted by FlopCounterMode;
    on the meta device it needs no memory."""
    with FlopCounterMode(display=False) as counter:
        loss = nn.functional.cross_entropy(model(example), target)
        loss.backward()
    return int(counter.get_total_flops())
