"""Neighbourhood attention against a brute-force definition written query by query, forward and backward."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mixers import create_mixer
from mixers.neighborhood import NeighborhoodAttention, _flex

DIM, HEADS = 16, 2


def make(kernel_size: int = 5, **options) -> NeighborhoodAttention:
    mixer = create_mixer("neighborhood", DIM, HEADS, kernel_size=kernel_size, **options).double()
    with torch.no_grad():  # a bias table far from zero, so a wrong offset shows
        if mixer.rpb is not None:
            mixer.rpb.normal_(0.0, 1.0)
    return mixer


def natten_start(i: int, length: int, k: int) -> int:
    """NATTEN's window start (dilation 1), written as its three cases rather than a clamp."""
    nb = k // 2
    if i < nb:
        return 0
    if i + nb >= length:
        return length - k
    return i - nb


def brute_force(mixer: NeighborhoodAttention, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Loop over queries: gather each one's k x k keys (k clipped to each axis), add the table entry of the offset,
    softmax, mix. Differentiable, so its gradients are the reference too."""
    H, W = grid
    k = mixer.kernel_size
    kh, kw = min(k, H), min(k, W)
    B, N, C = x.shape
    d = C // HEADS
    qkv = F.linear(x, mixer.qkv.weight, mixer.qkv.bias).view(B, N, 3, HEADS, d)
    q, key, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, N, heads, d)
    outs = []
    for r in range(H):
        for c in range(W):
            r0, c0 = natten_start(r, H, kh), natten_start(c, W, kw)
            neighbours = [(rr, cc) for rr in range(r0, r0 + kh) for cc in range(c0, c0 + kw)]
            idx = [rr * W + cc for rr, cc in neighbours]
            logits = torch.einsum("bhd,bkhd->bhk", q[:, r * W + c], key[:, idx]) / math.sqrt(d)  # (B, heads, kk)
            if mixer.rpb is not None:
                bias = torch.stack([mixer.rpb[:, rr - r + k - 1, cc - c + k - 1] for rr, cc in neighbours], -1)
                logits = logits + bias
            outs.append(torch.einsum("bhk,bkhd->bhd", logits.softmax(-1), v[:, idx]).reshape(B, C))
    return F.linear(torch.stack(outs, 1), mixer.proj.weight, mixer.proj.bias)


# Grids past one tile (TILE = 8) with a remainder, so the last tiles repeat queries, are in the list too.
@pytest.mark.parametrize("grid,kernel_size", [((7, 9), 5), ((1, 1), 7), ((3, 5), 7), ((4, 11), 3), ((9, 2), 5),
                                              ((6, 6), 1), ((13, 18), 7), ((17, 3), 3)])
@pytest.mark.parametrize("rel_pos_bias", [True, False])
@pytest.mark.parametrize("impl", ["tiled", "gather"])
def test_matches_brute_force_forward_and_backward(grid, kernel_size, rel_pos_bias, impl) -> None:
    mixer = make(kernel_size, rel_pos_bias=rel_pos_bias, impl=impl)
    x = torch.randn(2, grid[0] * grid[1], DIM, dtype=torch.float64, requires_grad=True)
    out = mixer(x, grid)
    assert mixer.impl == impl
    ref = brute_force(mixer, x, grid)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    weight = torch.randn_like(out)
    params = [x, *mixer.parameters()]
    grads = torch.autograd.grad((out * weight).sum(), params)
    ref_grads = torch.autograd.grad((ref * weight).sum(), params)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)


@pytest.mark.skipif(_flex() is None, reason="this torch has no flex_attention")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("grid", [(7, 9), (3, 5), (10, 4)])
def test_flex_path_matches_brute_force(grid) -> None:
    """The FlexAttention path's block mask and bias score_mod, run eagerly on the CPU (forward only there)."""
    mixer = make(5, impl="flex").float()
    x = torch.randn(2, grid[0] * grid[1], DIM)
    with torch.no_grad():
        out = mixer(x, grid)
        ref = brute_force(mixer.double(), x.double(), grid)
    assert mixer.impl == "flex"
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


def test_every_query_sees_kernel_squared_keys_and_the_cache_stays_out_of_the_state_dict() -> None:
    mixer = make(5)
    keys, bias = mixer._indices((6, 8), torch.device("cpu"))
    assert keys.shape == bias.shape == (48, 25)
    assert all(len(set(row.tolist())) == 25 for row in keys)
    assert set(mixer.state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "rpb"}


@pytest.mark.parametrize("preset,limit", [("micro", 0.03), ("tiny", 0.01)])
def test_parameters_close_to_attention(preset: str, limit: float) -> None:
    from models.vit import PRESETS

    cfg = PRESETS[preset]
    count = {name: sum(p.numel() for p in create_mixer(name, cfg.dim, cfg.num_heads).parameters())
             for name in ("attention", "neighborhood")}
    assert 0 < count["neighborhood"] / count["attention"] - 1 < limit


def test_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        create_mixer("neighborhood", DIM, HEADS, kernel_size=4)
    with pytest.raises(ValueError, match="unknown impl"):
        create_mixer("neighborhood", DIM, HEADS, impl="natten")
