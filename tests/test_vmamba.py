"""VMamba's SS2D: each scan direction equals the selective scan of the permuted sequence, forward and backward."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cross_scan_orders import cross_scan_orders
from mixers import create_mixer
from mixers.ops.selective_scan import selective_scan_reference
from mixers.ops.selective_scan.cpp_scan import cpp_unavailable_reason
from mixers.vmamba import SS2D, cross_merge, cross_scan

DIM = 16


def build(**options) -> SS2D:
    mixer = create_mixer("vmamba", DIM, 2, **options)
    assert isinstance(mixer, SS2D)
    return mixer


def ss2d_reference(m: SS2D, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """SS2D in float64, built from index lists: direction k scans the tokens in order k with the reference scan and
    writes each output back to the token it came from; the four are summed. Differentiable through autograd."""
    H, W = grid
    d, n, r = m.d_inner, m.d_state, m.dt_rank
    xz = F.linear(x, m.in_proj.weight, m.in_proj.bias)  # (B, L, 2 d)
    u, z = xz[..., :d], xz[..., d:]
    image = u.transpose(1, 2).reshape(x.shape[0], d, H, W)
    u = F.silu(F.conv2d(image, m.conv2d.weight, m.conv2d.bias, padding=m.d_conv // 2, groups=d)).flatten(2)
    y = torch.zeros_like(u)  # (B, d, L) in row-major grid order
    for k, order in enumerate(cross_scan_orders(*grid)):
        seq = u[:, :, order]  # (B, d, L) in scan order k
        x_dbl = seq.transpose(1, 2) @ m.x_proj_weight[k].T  # (B, L, r + 2N)
        delta = (x_dbl[..., :r] @ m.dt_projs_weight[k].T).transpose(1, 2)
        B, C = x_dbl[..., r:r + n].transpose(1, 2), x_dbl[..., r + n:].transpose(1, 2)
        out = selective_scan_reference(seq, delta, -m.A_logs[k * d:(k + 1) * d].exp(), B, C,
                                       m.Ds[k * d:(k + 1) * d], None, m.dt_projs_bias[k], True)
        y = y.index_add(2, torch.tensor(order), out)
    y = F.layer_norm(y.transpose(1, 2), (d,), m.out_norm.weight, m.out_norm.bias) * F.silu(z)
    return F.linear(y, m.out_proj.weight, m.out_proj.bias)


def perturb(mixer: SS2D) -> SS2D:
    with torch.no_grad():  # directions must differ, and D, conv and dt be non-trivial
        for p in mixer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return mixer


def test_cross_scan_and_merge_follow_the_index_lists() -> None:
    grid = (3, 5)
    x = torch.randn(2, 4, *grid)
    flat = x.flatten(2)
    orders = cross_scan_orders(*grid)
    for seq, order in zip(cross_scan(x), orders):
        assert torch.equal(seq, flat[:, :, order])
    ys = [torch.randn(2, 4, 15) for _ in orders]
    expected = sum(torch.zeros(2, 4, 15).index_add(2, torch.tensor(o), y) for o, y in zip(orders, ys))
    torch.testing.assert_close(cross_merge(ys, grid), expected)


CPP_PROBLEM = cpp_unavailable_reason(torch.device("cpu"), torch.float64)


@pytest.mark.parametrize("scan_impl", ["torch_stream", "torch_loop",
                                       pytest.param("cpp_loop", marks=pytest.mark.skipif(
                                           CPP_PROBLEM is not None, reason=f"cpp_loop: {CPP_PROBLEM}"))])
@pytest.mark.parametrize("grid", [(1, 1), (3, 5), (6, 4)])
@pytest.mark.parametrize("options", [{}, {"d_state": 4, "expand": 2, "conv_bias": True, "bias": True}])
def test_matches_reference_forward_and_backward(scan_impl: str, grid: tuple[int, int], options: dict) -> None:
    mixer = perturb(build(scan_impl=scan_impl, **options)).double()
    x = torch.randn(2, grid[0] * grid[1], DIM, dtype=torch.float64, requires_grad=True)
    out = mixer(x, grid)
    assert mixer.impl == scan_impl
    ref = ss2d_reference(mixer, x, grid)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    weight = torch.randn_like(out)
    params = [x, *mixer.parameters()]
    grads = torch.autograd.grad((out * weight).sum(), params)
    ref_grads = torch.autograd.grad((ref * weight).sum(), params)
    for (name, _), g, r in zip([("x", x), *mixer.named_parameters()], grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-10, msg=lambda m: f"{name}: {m}")


def test_each_direction_reaches_the_first_token_from_the_last_row_and_column() -> None:
    """Token (0, 0) hears from every token, so all four scans and the 2D conv feed the merged output."""
    mixer = perturb(build()).double()
    x = torch.randn(1, 4 * 6, DIM, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(mixer(x, (4, 6))[0, 0].sum(), x)
    assert (grad[0].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("preset,low,high", [("micro", -0.03, 0.0), ("tiny", -0.10, -0.05)])
def test_parameters_as_the_docstring_states(preset: str, low: float, high: float) -> None:
    from models.vit import PRESETS

    cfg = PRESETS[preset]
    count = {name: sum(p.numel() for p in create_mixer(name, cfg.dim, cfg.num_heads).parameters())
             for name in ("attention", "vmamba")}
    assert low < count["vmamba"] / count["attention"] - 1 < high


def test_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="scan_impl"):
        build(scan_impl="nope")
    with pytest.raises(ValueError, match="d_conv must be odd"):
        build(d_conv=4)


@pytest.mark.skipif(CPP_PROBLEM is not None, reason=f"cpp_loop: {CPP_PROBLEM}")
def test_the_grid_path_compiles_to_one_graph_and_matches_eager() -> None:
    """Compiled, the grid path (`cpp_loop`) is one graph, forward and backward: the scan orders are built in it, not
    looked up through `grid_cached`, whose inference-mode check broke every block's graph in two."""
    torch._dynamo.reset()
    mixer = perturb(build(scan_impl="cpp_loop"))
    x = torch.randn(2, 3 * 5, DIM, requires_grad=True)
    out = torch.compile(mixer, fullgraph=True)(x, (3, 5))
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    (grad_eager,) = torch.autograd.grad(mixer(x, (3, 5)).square().sum(), x)
    assert mixer.impl == "cpp_loop"
    torch.testing.assert_close(grad, grad_eager, rtol=1e-4, atol=1e-5)
