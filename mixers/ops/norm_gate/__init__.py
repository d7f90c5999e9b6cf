"""RMSNorm over groups of channels, times a weight and a silu gate: `rms_norm_gated`, the output norm of mamba2
(one group, Hydra and Mamba-2's `RMSNormGated` with the norm before the gate) and gla (a group per head, fla's
`FusedRMSNormSwishGate`). mamba-ssm and fla fuse it into one kernel on GPUs; as PyTorch ops on the CPU it was 8
ops forward and about 17 backward, each a pass over memory with a fixed cost per call. Two forms:
- `cpp_norm_gate.py` / `cpp_norm_gate.cpp`: one compiled pass over each row on the CPU (float32, float64), forward
  and backward, behind the op `mixerbench::rms_norm_gated`;
- `reference.py`: the PyTorch ops: the reference, and what runs elsewhere (GPUs, half types, no compiler), under
  `torch.compile` (inductor fuses them itself) and while `torch.jit.trace` runs (fvcore's count).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import cpu_kernels
from ..eager_op import EagerOp
from . import cpp_norm_gate
from .reference import rms_norm_gated_reference


def rms_norm_gated(x: Tensor, weight: Tensor, z: Tensor, eps: float, group_size: int | None = None) -> Tensor:
    """Each group of `group_size` channels of x (all C, where None) divided by its root mean square (eps added to
    the mean square), times `weight` (S,) (the same for every group), times silu(z).

    Args:
        x: (..., C), C a multiple of `group_size`.
        weight: (group_size,).
        z: the gate, shaped as x.
        eps: added to each group's mean square.
        group_size: channels per group S; None for one group of all C.

    Returns:
        Shaped as x, in x's dtype.
    """
    size = x.shape[-1] if group_size is None else group_size
    if z.shape != x.shape or weight.shape != (size,) or x.shape[-1] % size:
        raise ValueError(f"rms_norm_gated: need z shaped as x {tuple(x.shape)}, weight ({size},) and C a multiple "
                         f"of the group size; got z {tuple(z.shape)}, weight {tuple(weight.shape)}")
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or not cpp_norm_gate.runs(x, weight, z):
        return rms_norm_gated_reference(x, weight, z, eps, size)
    return _norm_gate_call(x.flatten(0, -2), weight, z.flatten(0, -2), eps).view(x.shape)


def _channels_adjacent(*tensors: Tensor) -> tuple[Tensor, ...]:
    return tuple(cpu_kernels.last_adjacent(t) for t in tensors)


# The op takes x and z as (R, C) and the weight as (S,); the groups are C / S.
def _norm_gate(x: Tensor, weight: Tensor, z: Tensor, eps: float) -> Tensor:
    x, z = _channels_adjacent(x, z)
    return cpp_norm_gate.forward(x, weight.contiguous(), z, eps)


_norm_gate_op = torch.library.custom_op("mixerbench::rms_norm_gated", _norm_gate, mutates_args=())


@_norm_gate_op.register_fake
def _norm_gate_fake(x: Tensor, weight: Tensor, z: Tensor, eps: float) -> Tensor:
    return x.new_empty(x.shape)


def _norm_gate_backward(dy: Tensor, x: Tensor, weight: Tensor, z: Tensor, eps: float
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dz), contiguous."""
    x, z = _channels_adjacent(x, z)
    return cpp_norm_gate.backward(dy.contiguous(), x, weight.contiguous(), z, eps)


_norm_gate_backward_op = torch.library.custom_op("mixerbench::rms_norm_gated_backward", _norm_gate_backward,
                                                 mutates_args=())
_norm_gate_backward_call = EagerOp(_norm_gate_backward_op, _norm_gate_backward)


@_norm_gate_backward_op.register_fake
def _norm_gate_backward_fake(dy: Tensor, x: Tensor, weight: Tensor, z: Tensor, eps: float
                             ) -> tuple[Tensor, Tensor, Tensor]:
    return x.new_empty(x.shape), weight.new_empty(weight.shape), x.new_empty(x.shape)


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    x, weight, z, eps = inputs
    ctx.save_for_backward(x, weight, z)
    ctx.eps = eps


def _backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:
    x, weight, z = ctx.saved_tensors
    dx, dweight, dz = _norm_gate_backward_call(dy, x, weight, z, ctx.eps)
    return dx, dweight, dz, None


# The op, or in plain eager on the CPU the same functions without the dispatcher; EagerOp registers the op's
# autograd (mixers/ops/eager_op.py).
_norm_gate_call = EagerOp(_norm_gate_op, _norm_gate, _setup_context, _backward)

__all__ = ["rms_norm_gated", "rms_norm_gated_reference"]
