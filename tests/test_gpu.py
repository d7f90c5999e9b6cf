"""GPU fast paths against their references; skipped where there is no CUDA device (or no mamba-ssm, or no triton)."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from mixers import create_mixer
from mixers.ops.selective_scan import resolve_scan_impl, selective_scan
from mixers.ops.selective_scan.triton_scan import triton_unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DIM, HEADS = 192, 3


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"])
def test_sdpa_backends_match_float64_naive(backend: str) -> None:
    """Each SDPA backend in bf16 against materialised attention in float64: forward and input gradient."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fused = create_mixer("attention", DIM, HEADS).cuda()
    naive = create_mixer("attention_naive", DIM, HEADS).cuda().double()
    naive.load_state_dict(fused.state_dict())
    x = torch.randn(2, 32 * 32, DIM, device="cuda")
    x_ref = x.double().requires_grad_()
    reference = naive(x_ref, (32, 32))
    (grad_ref,) = torch.autograd.grad(reference.square().sum(), x_ref)
    x_low = x.bfloat16().requires_grad_()
    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            out = fused.bfloat16()(x_low, (32, 32))
            (grad,) = torch.autograd.grad(out.float().square().sum(), x_low)
    except RuntimeError as error:
        pytest.skip(f"{backend} not available here: {error}")
    assert fused.impl == f"sdpa_{backend.split('_')[0].lower()}"
    assert relative_error(out, reference) < 2e-2
    assert relative_error(grad, grad_ref) < 5e-2


@pytest.mark.parametrize("name", ["swin", "linear", "mamba"])
def test_cuda_bf16_matches_cpu_fp32(name: str) -> None:
    torch.manual_seed(0)
    cpu = create_mixer(name, DIM, HEADS, layer_idx=1)
    gpu = create_mixer(name, DIM, HEADS, layer_idx=1)
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 15 * 17, DIM)
    reference = cpu(x, (15, 17))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = gpu.cuda()(x.cuda(), (15, 17))
    assert relative_error(out.float().cpu(), reference) < 3e-2


# mamba-ssm's own test tolerances (tests/ops/test_selective_scan.py): (rtol, atol) per input dtype.
MAMBA_TOLERANCES = {torch.float32: (6e-4, 2e-3), torch.bfloat16: (3e-2, 5e-2)}


def _scan_pair(impl: str, dtype: torch.dtype, length: int,
               reverse: bool = False) -> tuple[dict, dict, str, Tensor, Tensor]:
    """`impl` on CUDA inputs of `dtype` against torch_stream on the same values upcast to float32.

    Returns the low-precision inputs, their float32 copies, the implementation that ran, y and y_ref.
    """
    torch.manual_seed(0)
    b, d, n = 2, 64, 16
    inputs = dict(
        u=torch.randn(b, d, length), delta=0.5 * torch.randn(b, d, length), A=-torch.rand(d, n) - 0.5,
        B=torch.randn(b, n, length), C=torch.randn(b, n, length), D=torch.randn(d), z=torch.randn(b, d, length),
        delta_bias=0.1 * torch.randn(d),
    )
    low = {k: (v.cuda().to(dtype) if k in ("u", "delta", "B", "C", "z") else v.cuda()).requires_grad_()
           for k, v in inputs.items()}
    # Like with like (as mamba-ssm's tests): the reference gets the same rounded values, upcast to float32.
    # Against the unrounded float32 inputs, bf16's 2^-9 input rounding alone moves y past atol 5e-2 somewhere
    # among 2 x 64 x 4096 outputs (greatest relative difference 2.16 at L = 4096 on an H100).
    ref = {k: v.detach().float().requires_grad_() for k, v in low.items()}
    y, name = selective_scan(**low, delta_softplus=True, impl=impl, reverse=reverse)
    y_ref, _ = selective_scan(**ref, delta_softplus=True, impl="torch_stream", reverse=reverse)
    return low, ref, name, y, y_ref


def _assert_scan_matches(low: dict, ref: dict, y: Tensor, y_ref: Tensor, rtol: float, atol: float) -> None:
    """y and every input gradient of sum(y) within (rtol, atol), a gradient's atol scaled by its largest entry."""
    torch.testing.assert_close(y.float(), y_ref, rtol=rtol, atol=atol)
    grads = torch.autograd.grad(y.float().sum(), list(low.values()))
    grads_ref = torch.autograd.grad(y_ref.sum(), list(ref.values()))
    for name, g, g_ref in zip(low, grads, grads_ref):
        torch.testing.assert_close(g.float(), g_ref, rtol=rtol, atol=atol * max(1.0, g_ref.abs().max().item() / 10),
                                   msg=f"gradient of {name}")


@pytest.mark.skipif(resolve_scan_impl("auto", torch.device("cuda")) != "mamba_ssm_cuda",
                    reason="mamba-ssm's CUDA kernel does not import here")
@pytest.mark.parametrize("dtype", list(MAMBA_TOLERANCES))
def test_mamba_ssm_kernel_matches_pure_scan(dtype: torch.dtype) -> None:
    """mamba-ssm's kernel against our scan at mamba's own test tolerances, forward and every gradient."""
    low, ref, impl, y, y_ref = _scan_pair("mamba_ssm_cuda", dtype, 257)
    assert impl == "mamba_ssm_cuda"
    _assert_scan_matches(low, ref, y, y_ref, *MAMBA_TOLERANCES[dtype])


@pytest.mark.skipif(triton_unavailable_reason(torch.device("cuda"), torch.float32) is not None,
                    reason="triton does not import here")
@pytest.mark.parametrize("length", [4096, 65536])
@pytest.mark.parametrize("dtype", list(MAMBA_TOLERANCES))
@pytest.mark.parametrize("impl,reverse", [("triton", False), ("triton", True)])
def test_triton_kernels_match_pure_scan(impl: str, reverse: bool, dtype: torch.dtype, length: int) -> None:
    """The Triton kernels in both directions against our scan at mamba-ssm's
    tolerances, forward and every gradient, at L = 4096 and 65,536 (many chunks, and an L split at B x D = 128)."""
    low, ref, ran, y, y_ref = _scan_pair(impl, dtype, length, reverse)
    assert ran == impl and y.dtype == dtype
    _assert_scan_matches(low, ref, y, y_ref, *MAMBA_TOLERANCES[dtype])


def _time_major(t: Tensor) -> Tensor:
    """The same values as a (B, *, L) view of a (B, L, *) tensor: what mamba hands the scan since 44ce551."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("impl", ["mamba_ssm_cuda", "triton"])
@pytest.mark.parametrize("reverse", [False, True])
def test_gpu_scans_on_time_major_views_in_both_directions(impl: str, reverse: bool) -> None:
    """The GPU kernels get time-major views (the dispatch makes their rows along L contiguous) and scan in reverse
    (mamba-ssm's kernel by flipping five tensors): forward and every gradient in float32, at L = 257."""
    if impl == "mamba_ssm_cuda" and resolve_scan_impl("auto", torch.device("cuda")) != "mamba_ssm_cuda":
        pytest.skip("mamba-ssm's CUDA kernel does not import here")
    if impl == "triton" and triton_unavailable_reason(torch.device("cuda"), torch.float32) is not None:
        pytest.skip("triton does not import here")
    torch.manual_seed(0)
    b, d, n, length = 2, 64, 16, 257
    values = dict(u=torch.randn(b, d, length), delta=0.5 * torch.randn(b, d, length), A=-torch.rand(d, n) - 0.5,
                  B=torch.randn(b, n, length), C=torch.randn(b, n, length), D=torch.randn(d),
                  z=torch.randn(b, d, length), delta_bias=0.1 * torch.randn(d))
    leaves = {k: v.cuda().requires_grad_() for k, v in values.items()}
    ref = {k: v.detach().clone().requires_grad_() for k, v in leaves.items()}
    views = {k: _time_major(v) if v.dim() == 3 else v for k, v in leaves.items()}
    y, ran = selective_scan(**views, delta_softplus=True, impl=impl, reverse=reverse)
    y_ref, _ = selective_scan(**ref, delta_softplus=True, impl="torch_stream", reverse=reverse)
    assert ran == impl
    _assert_scan_matches(leaves, ref, y, y_ref, *MAMBA_TOLERANCES[torch.float32])


@pytest.mark.parametrize("scan_impl", ["mamba_ssm_cuda", "triton"])
def test_mamba_mixer_in_float32_on_cuda_matches_the_cpu(scan_impl: str) -> None:
    """The whole mixer (time-major projections, the token conv's PyTorch form, both directions' scans) in float32
    on CUDA against the CPU's compiled conv and scan: output and input gradient."""
    if scan_impl == "mamba_ssm_cuda" and resolve_scan_impl("auto", torch.device("cuda")) != "mamba_ssm_cuda":
        pytest.skip("mamba-ssm's CUDA kernel does not import here")
    if scan_impl == "triton" and triton_unavailable_reason(torch.device("cuda"), torch.float32) is not None:
        pytest.skip("triton does not import here")
    torch.manual_seed(0)
    cpu = create_mixer("mamba", 96, 3, layer_idx=1)
    gpu = create_mixer("mamba", 96, 3, layer_idx=1, scan_impl=scan_impl)
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 15 * 17, 96, requires_grad=True)
    x_gpu = x.detach().cuda().requires_grad_()
    out, expected = gpu.cuda()(x_gpu, (15, 17)), cpu(x, (15, 17))
    (grad,) = torch.autograd.grad(out.square().sum(), x_gpu)
    (grad_ref,) = torch.autograd.grad(expected.square().sum(), x)
    assert relative_error(out.cpu(), expected) < 1e-4
    assert relative_error(grad.cpu(), grad_ref) < 1e-4


def test_token_conv_on_cuda_matches_conv1d() -> None:
    """The depthwise token conv's PyTorch form (what runs on a GPU) against F.conv1d, forward and gradients, for
    mamba's causal and anti-causal and mamba2's centred taps, on time-major views."""
    import torch.nn.functional as F

    from mixers.ops.token_conv import depthwise_conv_tokens

    torch.manual_seed(0)
    for width, left in [(4, 3), (4, 0), (3, 1)]:
        rows = torch.randn(2, 37, 96, device="cuda", requires_grad=True)
        x = rows[..., :48]  # a slice of a projection's rows, as mamba hands it
        weight = torch.randn(48, 1, width, device="cuda", requires_grad=True)
        bias = torch.randn(48, device="cuda", requires_grad=True)
        out = depthwise_conv_tokens(x, weight, bias, left)
        padded = F.pad(x.transpose(1, 2), (left, width - 1 - left))
        expected = F.conv1d(padded, weight, bias, groups=48).transpose(1, 2)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        grads = torch.autograd.grad(out.square().sum(), (rows, weight, bias))
        grads_ref = torch.autograd.grad(expected.square().sum(), (rows, weight, bias))
        for g, g_ref in zip(grads, grads_ref):
            torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-4)
