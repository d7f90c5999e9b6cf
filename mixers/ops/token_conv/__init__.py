"""A depthwise 1-D conv along the tokens of a time-major (B, L, C) tensor: the op `mixerbench::depthwise_conv_tokens`.

`nn.Conv1d` wants channel-major (B, C, L), and the mixers' projections are time-major: on the CPU the layout
copies around it and oneDNN's depthwise kernel took about twice as long, forward and backward, as the same conv
done on the time-major rows (Mamba's width-4 conv at 1,024 tokens; the timings are in issue 33's note). Two forms:
- `cpp_conv.py` / `cpp_conv.cpp`: one compiled pass on the CPU (float32, float64) for the forward (silu after it
  in the same pass) and another for the whole backward (the gradient through silu, dx, the weight's and the bias's);
- `shifted.py`: K fused multiply-adds over shifted views of the padded input, in PyTorch ops: the reference, and
  what runs elsewhere (GPUs, half types, no compiler).
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ...base import CUSTOM_OP_MACS
from ..eager_op import EagerOp
from . import cpp_conv, shifted


def depthwise_conv_tokens(x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool = False) -> Tensor:
    """out[b, t, c] = bias[c] + sum_k weight[c, 0, k] x[b, t - left + k, c], zero outside the sequence; silu(out)
    where `silu`.

    Equal to `F.conv1d(x.transpose(1, 2), weight, bias, padding=(left, K - 1 - left), groups=C)`, transposed back:
    `left = K - 1` is a causal conv (Mamba), `left = 0` with the taps flipped its anti-causal mirror (Vim's
    backward direction), `left = K // 2` a centred one. One op (`mixerbench::depthwise_conv_tokens`, with its
    backward another) so the counters see a conv of L x K MACs per channel, not element-wise work. `silu` is the
    activation Mamba's blocks put after the conv, applied as each output row is written: as an op of its own it was
    a pass over (B, L, C) per call. Its backward recomputes the conv's output rather than keep it (the forward
    holds x only), in the compiled backward's one pass. At the tiny Mamba's shape (1,024 tokens, 384 channels,
    2 threads) the fused forward took a quarter less than conv then silu, forward and backward together 6% less.

    Args:
        x: (B, L, C), any strides (a view of a projection's output).
        weight: (C, 1, K), as `nn.Conv1d(C, C, K, groups=C)` holds it.
        bias: (C,) or None.
        left: how many of the K taps reach before the output's own step, 0 <= left < K.
        silu: apply silu to the conv's output.

    Returns:
        (B, L, C) in x's dtype (summed in the wider of x's and the weight's, as a conv accumulates), contiguous.
    """
    channels, _, width = weight.shape
    if x.dim() != 3 or x.shape[-1] != channels or weight.dim() != 3 or weight.shape[1] != 1:
        raise ValueError(f"depthwise_conv_tokens: x must be (B, L, C) and weight (C, 1, K), got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    if not 0 <= left < width:
        raise ValueError(f"depthwise_conv_tokens: need 0 <= left < K = {width}, got left={left}")
    return _conv_call(x, weight, bias, left, silu)


def _forward(x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool) -> Tensor:
    """The compiled pass where it runs (CPU, float32 or float64), else the PyTorch ops."""
    if cpp_conv.runs(x, weight, bias):
        return cpp_conv.conv(x, weight, bias, left, silu)
    return shifted.shifted_sum(x, weight, bias, left, silu)


def _conv(x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool) -> Tensor:
    return _forward(x, weight, bias, left, silu)


_conv_op = torch.library.custom_op("mixerbench::depthwise_conv_tokens", _conv, mutates_args=())


@_conv_op.register_fake
def _conv_fake(x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool) -> Tensor:
    return x.new_empty(x.shape)


def _conv_backward(grad: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias) of the conv (and silu, where `silu`); dbias empty where there is no bias (an op returns
    tensors only).

    With silu the conv's output is recomputed and the gradient taken through silu first. dx is the conv of the
    gradient with the taps flipped, reaching the other way (K - 1 - left steps back); dweight[c, 0, k] sums grad
    times x shifted by tap k. Where the compiled pass runs, all of it is one pass (`cpp_conv.backward`).
    """
    if cpp_conv.runs(grad, x, weight, bias):
        dx, dweight, dbias = cpp_conv.backward(grad, x, weight, bias, left, silu)
        return dx, dweight, weight.new_empty(0) if dbias is None else dbias
    if silu:
        grad = torch.ops.aten.silu_backward(grad, shifted.shifted_sum(x, weight, bias, left))
    has_bias, width = bias is not None, weight.shape[-1]
    dx = _forward(grad, weight.flip(-1), None, width - 1 - left, False)
    dweight = shifted.weight_grad(grad, x, weight, left)
    wide = torch.promote_types(weight.dtype, grad.dtype)  # summed over B and L in at least the weight's precision
    dbias = grad.sum((0, 1), dtype=wide).to(weight.dtype) if has_bias else weight.new_empty(0)
    return dx, dweight, dbias


_conv_backward_op = torch.library.custom_op("mixerbench::depthwise_conv_tokens_backward", _conv_backward,
                                            mutates_args=())
_conv_backward_call = EagerOp(_conv_backward_op, _conv_backward)


@_conv_backward_op.register_fake
def _conv_backward_fake(grad: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, left: int, silu: bool
                        ) -> tuple[Tensor, Tensor, Tensor]:
    dbias = weight.new_empty(0 if bias is None else weight.shape[0])
    return x.new_empty(x.shape), weight.new_empty(weight.shape), dbias


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    x, weight, bias, left, silu = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.left, ctx.silu = left, silu


def _backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
    x, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = _conv_backward_call(grad, x, weight, bias, ctx.left, ctx.silu)
    return dx, dweight, None if bias is None else dbias, None, None


# The op, or in plain eager on the CPU the same functions without the dispatcher; EagerOp registers the op's
# autograd (mixers/ops/eager_op.py).
_conv_call = EagerOp(_conv_op, _conv, _setup_context, _backward)


def depthwise_conv_tokens_macs(batch: int, length: int, channels: int, width: int) -> int:
    """MACs of the conv's forward: K per output, L outputs per channel (the backward does twice as many)."""
    return batch * length * channels * width


@register_flop_formula(torch.ops.mixerbench.depthwise_conv_tokens)
def _conv_flops(x_shape: list[int], weight_shape: list[int], *args, **kwargs) -> int:
    return 2 * depthwise_conv_tokens_macs(*x_shape, weight_shape[-1])


@register_flop_formula(torch.ops.mixerbench.depthwise_conv_tokens_backward)
def _conv_backward_flops(grad_shape: list[int], x_shape: list[int], weight_shape: list[int], bias_shape, left: int,
                         silu: bool, **kwargs) -> int:
    convs = 2 + int(silu)  # dx and dweight, and the forward recomputed for silu's gradient
    return 2 * convs * depthwise_conv_tokens_macs(*x_shape, weight_shape[-1])


def _macs_from_shapes(shapes: list[tuple[int, ...] | None]) -> int:
    x_shape, weight_shape = shapes[0], shapes[1]
    if x_shape is None or weight_shape is None:
        raise ValueError("depthwise_conv_tokens: the counter gave no shapes for x and the weight")
    return depthwise_conv_tokens_macs(*x_shape, weight_shape[-1])


CUSTOM_OP_MACS["mixerbench::depthwise_conv_tokens"] = _macs_from_shapes
