"""The depthwise conv along time-major tokens (mixers/ops/token_conv.py) against nn.Conv1d, and its counts."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from mixers.base import CUSTOM_OP_MACS
from mixers.ops.token_conv import cpp_conv, depthwise_conv_tokens, depthwise_conv_tokens_macs

needs_cpp = pytest.mark.skipif(cpp_conv.unavailable_reason() is not None,
                               reason=f"the compiled conv is unavailable: {cpp_conv.unavailable_reason()}")
FORMS = ["compiled", "pytorch"]


@pytest.fixture
def form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test through the compiled conv, or through the PyTorch ops as where it cannot be built."""
    if request.param == "compiled" and cpp_conv.unavailable_reason() is not None:
        pytest.skip(f"the compiled conv is unavailable: {cpp_conv.unavailable_reason()}")
    if request.param == "pytorch":
        monkeypatch.setattr(cpp_conv, "_library", lambda: "no compiler (a test's stand-in)")
    return request.param


def conv1d_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, left: int,
                     silu: bool = False) -> torch.Tensor:
    """The same conv through F.conv1d on the channel-major copy, padded `left` before and K - 1 - left after; then
    F.silu where `silu`."""
    width = weight.shape[-1]
    padded = F.pad(x.transpose(1, 2), (left, width - 1 - left))
    out = F.conv1d(padded, weight, bias, groups=x.shape[-1]).transpose(1, 2)
    return F.silu(out) if silu else out


@pytest.mark.parametrize("form", FORMS, indirect=True)
@pytest.mark.parametrize("width,left", [(4, 3), (4, 0), (3, 1), (1, 0), (5, 2)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("length", [2, 7, 70])
@pytest.mark.parametrize("silu", [False, True])
def test_equals_conv1d_forward_and_gradients_in_float64(form: str, width: int, left: int, with_bias: bool,
                                                        length: int, silu: bool) -> None:
    """Causal (left = K - 1), anti-causal (left = 0) and centred convs, with and without the silu after them,
    equal F.conv1d's (and F.silu's) in float64, output and the gradients of x, the weight and the bias, on a
    strided x (a slice of wider rows, as Mamba's in_proj gives); 70 steps span several of the compiled form's work
    items (each backward item recomputes the gradient at the steps around its own), 2 are fewer than some taps."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(2, length, 10, generator=g, dtype=torch.float64)
    weight = torch.randn(5, 1, width, generator=g, dtype=torch.float64)
    bias = torch.randn(5, generator=g, dtype=torch.float64) if with_bias else None
    dy = torch.randn(2, length, 5, generator=g, dtype=torch.float64)

    def run(conv) -> tuple[torch.Tensor, ...]:
        leaves = [t.detach().clone().requires_grad_() for t in (rows, weight, *([bias] if with_bias else []))]
        out = conv(leaves[0][..., 2:7], leaves[1], leaves[2] if with_bias else None, left, silu)
        return (out, *torch.autograd.grad(out, leaves, dy))

    ours, reference = run(depthwise_conv_tokens), run(conv1d_reference)
    assert ours[0].is_contiguous()
    for name, a, b in zip(("out", "dx", "dweight", "dbias"), ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"{name} differs")


@needs_cpp
@pytest.mark.parametrize("silu", [False, True])
def test_compiled_float32_matches_the_pytorch_form(monkeypatch: pytest.MonkeyPatch, silu: bool) -> None:
    """At Mamba's width and a tiny block's shape, on 2 threads: the compiled pass (its silu the kernels' polynomial
    exp) against the PyTorch ops, output and gradients, within float32's rounding (the weight's gradient sums
    2 x 300 products per tap)."""
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(2, 300, 96, generator=g)
    weight, bias = torch.randn(48, 1, 4, generator=g), torch.randn(48, generator=g)
    dy = torch.randn(2, 300, 48, generator=g)

    def run() -> tuple[torch.Tensor, ...]:
        leaves = [t.detach().clone().requires_grad_() for t in (rows, weight, bias)]
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            out = depthwise_conv_tokens(leaves[0][..., :48], leaves[1], leaves[2], 3, silu)
            return (out, *torch.autograd.grad(out, leaves, dy))
        finally:
            torch.set_num_threads(before)

    assert cpp_conv.runs(rows, weight, bias)
    compiled = run()
    monkeypatch.setattr(cpp_conv, "_library", lambda: "no compiler (a test's stand-in)")
    assert not cpp_conv.runs(rows, weight, bias)
    for name, a, b in zip(("out", "drows", "dweight", "dbias"), compiled, run()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4, msg=f"{name} differs")


def test_gradcheck() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 1, 4, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    for left in (0, 3):
        for silu in (False, True):
            assert torch.autograd.gradcheck(lambda *a: depthwise_conv_tokens(*a, left, silu), (x, weight, bias))


@pytest.mark.parametrize("form", FORMS, indirect=True)
def test_opcheck(form: str) -> None:
    x = torch.randn(2, 6, 3, requires_grad=True)
    weight = torch.randn(3, 1, 4, requires_grad=True)
    for bias in (torch.randn(3, requires_grad=True), None):
        for silu in (False, True):
            torch.library.opcheck(torch.ops.mixerbench.depthwise_conv_tokens.default, (x, weight, bias, 3, silu))


def test_half_input_keeps_its_dtype() -> None:
    """A bf16 x with a float32 weight (autocast's case) is summed in float32 and returned in bf16, as a conv's
    output under autocast is."""
    x = torch.randn(1, 9, 4)
    weight, bias = torch.randn(4, 1, 4), torch.randn(4)
    out = depthwise_conv_tokens(x.bfloat16(), weight, bias, 3)
    assert out.dtype == torch.bfloat16
    expected = conv1d_reference(x.bfloat16().float(), weight, bias, 3)
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("left,shape", [(4, (1, 5, 3)), (-1, (1, 5, 3)), (0, (1, 5, 2))])
def test_bad_arguments_are_refused_in_one_line(left: int, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"^depthwise_conv_tokens: [^\n]+$"):
        depthwise_conv_tokens(torch.randn(shape), torch.randn(3, 1, 4), None, left)


def test_counters_see_a_conv_forward_and_backward() -> None:
    """FlopCounterMode counts L x K MACs per channel forward and twice that backward (dx and the weight's
    gradient), three times with silu (the conv recomputed for its gradient); fvcore's handle counts the forward
    from the shapes."""
    x = torch.randn(2, 9, 5, requires_grad=True)
    weight = torch.randn(5, 1, 4, requires_grad=True)
    macs = depthwise_conv_tokens_macs(2, 9, 5, 4)
    with FlopCounterMode(display=False) as counter:
        out = depthwise_conv_tokens(x, weight, None, 3)
    assert counter.get_total_flops() == 2 * macs
    with FlopCounterMode(display=False) as counter:
        out.sum().backward()
    assert counter.get_total_flops() == 2 * 2 * macs
    with FlopCounterMode(display=False) as counter:
        depthwise_conv_tokens(x, weight, None, 3, silu=True).sum().backward()
    assert counter.get_total_flops() == 2 * macs + 2 * 3 * macs
    assert CUSTOM_OP_MACS["mixerbench::depthwise_conv_tokens"]([(2, 9, 5), (5, 1, 4), None]) == macs
    with pytest.raises(ValueError, match=re.escape("no shapes")):
        CUSTOM_OP_MACS["mixerbench::depthwise_conv_tokens"]([None, (5, 1, 4)])


def test_runs_on_the_meta_device() -> None:
    """The counters build models on the meta device: the op and its backward have fakes."""
    x = torch.randn(2, 9, 5, device="meta", requires_grad=True)
    weight = torch.randn(5, 1, 4, device="meta", requires_grad=True)
    out = depthwise_conv_tokens(x, weight, torch.randn(5, device="meta", requires_grad=True), 0)
    out.sum().backward()
    assert out.shape == x.shape and x.grad.shape == x.shape and weight.grad.shape == weight.shape
