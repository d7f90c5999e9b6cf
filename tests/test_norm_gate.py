"""The gated RMSNorm (mixers/ops/norm_gate): the compiled pass against the PyTorch form, forward and every
gradient, in float64 and float32, on strided views, one group and several; opcheck and gradcheck; and where the
PyTorch form runs instead."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mixers.ops.norm_gate import cpp_norm_gate, rms_norm_gated, rms_norm_gated_reference

needs_cpp = pytest.mark.skipif(cpp_norm_gate.unavailable_reason() is not None,
                               reason=f"the compiled pass is unavailable: {cpp_norm_gate.unavailable_reason()}")


def inputs(shape: tuple[int, ...], group_size: int, dtype=torch.float64) -> list[torch.Tensor]:
    """x and z as views of wider projections (rows not adjacent), z over silu's whole curve, a weight away from 1."""
    x = torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., : shape[-1]]
    z = 4 * torch.randn(*shape[:-1], shape[-1] + 3, dtype=dtype)[..., 3:]
    weight = 1 + 0.5 * torch.randn(group_size, dtype=dtype)
    return [t.requires_grad_() if t.is_leaf else t.detach().requires_grad_() for t in (x, weight, z)]


def the_definition(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor, eps: float, size: int) -> torch.Tensor:
    """Written out without F.rms_norm: each group over its root mean square."""
    groups = x.unflatten(-1, (-1, size))
    normed = groups / torch.sqrt(groups.square().mean(-1, keepdim=True) + eps) * weight
    return normed.flatten(-2) * z * torch.sigmoid(z)


@needs_cpp
@pytest.mark.parametrize("shape,group_size", [((2, 37, 64), 64), ((3, 5, 12), 4), ((1, 1, 7), 7), ((70, 33), 11)])
def test_compiled_pass_matches_the_definition_forward_and_gradients(shape: tuple[int, ...], group_size: int) -> None:
    x, weight, z = inputs(shape, group_size)
    out = rms_norm_gated(x, weight, z, 1e-5, group_size)
    expected = the_definition(x, weight, z, 1e-5, group_size)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(rms_norm_gated_reference(x, weight, z, 1e-5, group_size), expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, weight, z], grad)
    want = torch.autograd.grad(expected, [x, weight, z], grad)
    for name, g, w in zip(["x", "weight", "z"], got, want):
        torch.testing.assert_close(g, w, rtol=1e-11, atol=1e-12, msg=lambda m: f"d{name}: {m}")


@needs_cpp
def test_compiled_float32_is_within_float_round_off_of_float64() -> None:
    """The pass sums a group's squares in its own order: within a few ulp of float64, as torch's ops are."""
    x, weight, z = inputs((4, 64, 64), 64, torch.float32)
    out = rms_norm_gated(x, weight, z, 1e-5)
    exact = the_definition(*(t.detach().double() for t in (x, weight, z)), 1e-5, 64)
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-6)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, weight, z], grad)
    doubles = [t.detach().double().requires_grad_() for t in (x, weight, z)]
    want = torch.autograd.grad(the_definition(*doubles, 1e-5, 64), doubles, grad.double())
    for name, g, w in zip(["x", "weight", "z"], got, want):
        scale = w.abs().max().item()
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5 * scale, msg=lambda m: f"d{name}: {m}")


@needs_cpp
def test_gradcheck_and_opcheck() -> None:
    x, weight, z = inputs((3, 4, 6), 3)
    assert torch.autograd.gradcheck(lambda *t: rms_norm_gated(*t[:2], t[2], 1e-5, 3), (x, weight, z))
    rows = [t.detach().flatten(0, -2) if t.dim() > 1 else t.detach() for t in (x, weight, z)]
    torch.library.opcheck(torch.ops.mixerbench.rms_norm_gated.default, (rows[0], rows[1], rows[2], 1e-5))


def test_half_inputs_run_the_pytorch_form_and_keep_their_dtype() -> None:
    x, weight, z = (t.detach().bfloat16() for t in inputs((2, 9, 8), 8))
    out = rms_norm_gated(x, weight, z, 1e-5)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, rms_norm_gated_reference(x, weight, z, 1e-5, 8))


@pytest.mark.parametrize("weight_size,z_shape", [(5, (2, 3, 8)), (8, (2, 3, 7)), (3, (2, 3, 8))])
def test_bad_shapes_are_refused_in_one_line(weight_size: int, z_shape: tuple[int, ...]) -> None:
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match=r"^rms_norm_gated: need z shaped as x") as info:
        rms_norm_gated(x, torch.ones(weight_size), torch.randn(z_shape), 1e-5, group_size=weight_size)
    assert "\n" not in str(info.value)


def test_is_silu_gated_rms_norm_for_one_group() -> None:
    """One group is torch's rms_norm over the last dimension, times the weight, times silu(z)."""
    x, weight, z = (t.detach() for t in inputs((3, 10, 16), 16))
    expected = F.rms_norm(x, (16,), weight, 1e-6) * F.silu(z)
    torch.testing.assert_close(rms_norm_gated(x, weight, z, 1e-6), expected)
