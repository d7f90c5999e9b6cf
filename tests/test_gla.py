"""Gated linear attention: the chunked form against the step-by-step recurrence, and the bidirectional mixer."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from mixers import create_mixer
from mixers.gla import BiGLA, log_sigmoid
from mixers.ops.gla import chunk_gla, naive_recurrent_gla

DIM, HEADS = 16, 2


def inputs(batch: int, heads: int, length: int, key_dim: int, value_dim: int, dtype=torch.float64,
           gate_scale: float = 1.0) -> list[torch.Tensor]:
    q, k = torch.randn(2, batch, heads, length, key_dim, dtype=dtype)
    v = torch.randn(batch, heads, length, value_dim, dtype=dtype)
    g = F.logsigmoid(torch.randn(batch, heads, length, key_dim, dtype=dtype) * gate_scale)
    return [t.requires_grad_() for t in (q, k, v, g)]


@pytest.mark.parametrize("length,chunk_size", [(37, 16), (5, 16), (16, 16), (32, 16), (23, 7), (1, 4), (30, 1)])
def test_chunk_matches_recurrence_forward_and_backward(length: int, chunk_size: int) -> None:
    tensors = inputs(2, 3, length, 6, 5)
    out = chunk_gla(*tensors, chunk_size=chunk_size)
    ref = naive_recurrent_gla(*tensors)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    weight = torch.randn_like(out)
    grads = torch.autograd.grad((out * weight).sum(), tensors)
    ref_grads = torch.autograd.grad((ref * weight).sum(), tensors)
    for name, g, r in zip("qkvg", grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-11, msg=lambda m: f"d{name}: {m}")


def test_chunk_is_stable_with_strong_decays_in_float32() -> None:
    """Gates near log(0) per step would overflow a q exp(b) / k exp(-b) factorisation within one chunk."""
    tensors = inputs(1, 2, 50, 4, 4, dtype=torch.float32, gate_scale=200.0)
    assert tensors[3].min() < -100  # decays far below float32's exp range over a chunk
    out = chunk_gla(*tensors, chunk_size=16)
    assert torch.isfinite(out).all()
    ref = naive_recurrent_gla(*(t.double() for t in tensors))
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in tensors)


def test_chunk_keeps_half_precision_inputs_dtype() -> None:
    tensors = [t.detach().to(torch.bfloat16) for t in inputs(1, 1, 9, 4, 4)]
    assert chunk_gla(*tensors, chunk_size=4).dtype == torch.bfloat16


def bigla_reference(m: BiGLA, x: torch.Tensor) -> torch.Tensor:
    """The mixer written out with the recurrence: forward GLA plus the reversed sequence's, RMSNorm, swish gate."""
    heads = m.num_heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return rearrange(t, "b l (h d) -> b h l d", h=heads)

    q, k, v = split(m.q_proj(x)), split(m.k_proj(x)), split(m.v_proj(x))
    g_fwd, g_bwd = (split(F.logsigmoid(p(x)) / m.gate_logit_normalizer) for p in m.gk_proj)
    o = naive_recurrent_gla(q, k, v, g_fwd)
    o = o + naive_recurrent_gla(q.flip(2), k.flip(2), v.flip(2), g_bwd.flip(2)).flip(2)
    o = F.rms_norm(o, (m.head_v_dim,), m.g_norm_weight, m.norm_eps)
    return m.o_proj(rearrange(o, "b h l d -> b l (h d)") * F.silu(m.g_proj(x)))


@pytest.mark.parametrize("grid,chunk_size", [((1, 1), 16), ((5, 7), 16), ((3, 11), 4), ((4, 4), 16)])
def test_mixer_matches_recurrence_forward_and_backward(grid: tuple[int, int], chunk_size: int) -> None:
    mixer = create_mixer("gla", DIM, HEADS, chunk_size=chunk_size).double()
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, grid[0] * grid[1], DIM, dtype=torch.float64, requires_grad=True)
    out = mixer(x, grid)
    ref = bigla_reference(mixer, x)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)
    params = [x, *mixer.parameters()]
    weight = torch.randn_like(out)
    grads = torch.autograd.grad((out * weight).sum(), params)
    ref_grads = torch.autograd.grad((ref * weight).sum(), params)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-10)


def test_both_directions_run() -> None:
    mixer = create_mixer("gla", DIM, HEADS).double()
    x = torch.randn(1, 12, DIM, dtype=torch.float64, requires_grad=True)
    out = mixer(x, (3, 4))
    (first,) = torch.autograd.grad(out[0, 0].sum(), x, retain_graph=True)
    (last,) = torch.autograd.grad(out[0, -1].sum(), x)
    assert first[0, -1].abs().max() > 0 and last[0, 0].abs().max() > 0


def test_bfloat16_mixer_keeps_dtype() -> None:
    mixer = create_mixer("gla", DIM, HEADS).to(torch.bfloat16)
    out = mixer(torch.randn(2, 20, DIM, dtype=torch.bfloat16), (4, 5))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize("preset,options,low,high", [("micro", {}, 0.15, 0.20), ("tiny", {}, 0.04, 0.07),
                                                     ("micro", {"gate_low_rank_dim": 4}, 0.0, 0.04)])
def test_parameters_as_the_docstring_states(preset: str, options: dict, low: float, high: float) -> None:
    from models.vit import PRESETS

    cfg = PRESETS[preset]
    attention = sum(p.numel() for p in create_mixer("attention", cfg.dim, cfg.num_heads).parameters())
    gla = sum(p.numel() for p in create_mixer("gla", cfg.dim, cfg.num_heads, **options).parameters())
    assert low < gla / attention - 1 < high


def test_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="multiple of num_heads"):
        create_mixer("gla", 20, 4, expand_k=0.5)
    with pytest.raises(ValueError, match="chunk_size"):
        create_mixer("gla", DIM, HEADS, chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        chunk_gla(*inputs(1, 1, 3, 2, 2), chunk_size=0)


def test_chunk_factorised_path_matches_recurrence_in_float32() -> None:
    """Gates of the mixer's usual size (log decays within a chunk well inside the factorised form's limit) take the
    one-matmul intra-chunk form: equal to the float64 recurrence within float32 round-off over 50 steps (1e-5)."""
    from mixers.ops.gla.chunk import _FACTORISED_LOG_DECAY_LIMIT

    tensors = inputs(1, 2, 50, 8, 4, dtype=torch.float32)
    chunk_log_decay = tensors[3].detach()[:, :, :16].sum(2).min()
    assert -chunk_log_decay < _FACTORISED_LOG_DECAY_LIMIT[torch.float32]  # so the factorised form runs
    out = chunk_gla(*tensors, chunk_size=16)
    ref = naive_recurrent_gla(*(t.detach().double() for t in tensors))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_log_sigmoid_is_logsigmoid_with_its_gradient_everywhere() -> None:
    """The CPU form (log of sigmoid, and y itself far below 0): float64 to rounding, float32 within a few of
    float32's steps of float64's value (F.logsigmoid's own float32 error is of that order), and the gradient
    sigmoid(-y) at the kink-prone points: exactly 0, far below (no NaN from the branch `where` drops), far above."""
    y = torch.cat([torch.linspace(-120, 120, 4001, dtype=torch.float64),
                   torch.tensor([0.0, -80.0, -1e4, 1e4], dtype=torch.float64)])
    for dtype, tolerance in ((torch.float64, 1e-14), (torch.float32, 1e-6)):
        x = y.to(dtype).requires_grad_()
        out = log_sigmoid(x)
        (grad,) = torch.autograd.grad(out.sum(), x)
        exact = y.clone().requires_grad_()
        ref = F.logsigmoid(exact)
        (ref_grad,) = torch.autograd.grad(ref.sum(), exact)
        torch.testing.assert_close(out.double(), ref.detach(), rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(grad.double(), ref_grad, rtol=tolerance, atol=tolerance)

