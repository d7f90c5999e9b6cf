"""Linear attention equals its explicit quadratic form, and keeps a float32 state for low-precision inputs."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange

from mixers import create_mixer

DIM, HEADS = 48, 3


def quadratic_form(mixer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """out_i = sum_j (phi(q_i).phi(k_j)) v_j / sum_j phi(q_i).phi(k_j), with the N x N similarity matrix formed."""
    q, k, v = rearrange(mixer.qkv(x), "b n (three h d) -> three b h n d", three=3, h=HEADS)
    q, k = F.elu(q) + 1, F.elu(k) + 1
    similarity = q @ k.transpose(-2, -1)  # (B, heads, N, N)
    out = (similarity @ v) / similarity.sum(-1, keepdim=True)
    return mixer.proj(rearrange(out, "b h n d -> b n (h d)"))


def test_equals_quadratic_form() -> None:
    mixer = create_mixer("linear", DIM, HEADS).double()
    x = torch.randn(2, 5 * 13, DIM, dtype=torch.float64)
    torch.testing.assert_close(mixer(x, (5, 13)), quadratic_form(mixer, x), rtol=1e-6, atol=1e-7)


def test_bfloat16_input_is_stable_at_many_tokens() -> None:
    mixer = create_mixer("linear", DIM, HEADS)
    x = 4 * torch.randn(1, 128 * 128, DIM)
    reference = mixer(x, (128, 128))
    low = mixer.to(torch.bfloat16)(x.bfloat16(), (128, 128))
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    relative = (low.float() - reference).norm() / reference.norm()
    assert relative < 2e-2


def test_state_stays_float32_under_autocast() -> None:
    mixer = create_mixer("linear", DIM, HEADS)
    x = torch.randn(1, 64, DIM)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mixer(x, (8, 8))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = quadratic_form(mixer.double(), x.double())
    assert (out.double() - reference).norm() / reference.norm() < 2e-2
