"""Tests for the Swin window-attention mixer: shapes, padding, shifts, parity with timm, MAC count."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import mixers.swin as swin_module
from margins import clearly_non_zero, largest
from mixers import create_mixer
from mixers.swin import SwinAttention

DIM, HEADS = 32, 4
GRIDS = [(7, 9), (1, 1), (5, 13), (14, 14), (8, 8)]


def make(layer_idx: int = 0, window_size: int = 7, dim: int = DIM, heads: int = HEADS, seed: int = 0,
         ) -> SwinAttention:
    torch.manual_seed(seed)
    mixer = SwinAttention(dim, heads, layer_idx=layer_idx, window_size=window_size)
    with torch.no_grad():  # a bias table far from zero, so that a wrong index or offset shows
        mixer.relative_position_bias_table.normal_(0.0, 1.0)
    return mixer


def tokens(grid: tuple[int, int], batch: int = 2, dim: int = DIM, seed: int = 1,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, grid[0] * grid[1], dim, generator=g).to(dtype)


def reference(mixer: SwinAttention, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Global attention over the real tokens with an explicit N x N bias + mask built pair by pair, in float64.

    The pair rule follows the paper on the bottom/right padded grid: roll every coordinate by -shift; two tokens
    may attend when they share a window and a shift region in both axes; the bias is the table entry for their
    offset inside the window. Masked pairs are excluded exactly (-inf), not by a large negative number.
    """
    H, W = grid
    ws, s, heads = mixer.window_size, mixer.shift, mixer.num_heads
    Hp, Wp = math.ceil(H / ws) * ws, math.ceil(W / ws) * ws
    table = mixer.relative_position_bias_table.detach().double()  # ((2ws-1)^2, heads)

    def place(r: int, size: int) -> tuple[int, int, int]:
        rr = (r - s) % size  # coordinate after the cyclic shift of the padded grid
        region = 0 if (s == 0 or rr < size - ws) else (1 if rr < size - s else 2)
        return rr // ws, region, rr % ws  # window, shift region, position inside the window

    coords = [(r, c) for r in range(H) for c in range(W)]
    N = len(coords)
    bias = torch.full((heads, N, N), float("-inf"), dtype=torch.float64)
    for i, (ri, ci) in enumerate(coords):
        wy_i, gy_i, py_i = place(ri, Hp)
        wx_i, gx_i, px_i = place(ci, Wp)
        for j, (rj, cj) in enumerate(coords):
            wy_j, gy_j, py_j = place(rj, Hp)
            wx_j, gx_j, px_j = place(cj, Wp)
            if (wy_i, gy_i, wx_i, gx_i) != (wy_j, gy_j, wx_j, gx_j):
                continue
            index = (py_i - py_j + ws - 1) * (2 * ws - 1) + (px_i - px_j + ws - 1)
            bias[:, i, j] = table[index]

    x = x.double()
    B, _, C = x.shape
    qkv = F.linear(x, mixer.qkv.weight.double(), mixer.qkv.bias.double())  # (B, N, 3C)
    q, k, v = qkv.view(B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)  # 3 x (B, heads, N, d)
    logits = q @ k.transpose(-2, -1) / math.sqrt(C // heads) + bias  # (B, heads, N, N)
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, N, C)  # (B, N, C)
    return F.linear(out, mixer.proj.weight.double(), mixer.proj.bias.double())


@pytest.mark.parametrize("layer_idx", [0, 1])
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_shape_and_dtype(grid, layer_idx, dtype):
    mixer = make(layer_idx).to(dtype)
    x = tokens(grid, dtype=dtype)
    out = mixer(x, grid)
    assert out.shape == x.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert mixer.impl.startswith("sdpa")


def test_registry_builds_it():
    mixer = create_mixer("swin", DIM, HEADS, layer_idx=3, window_size=4)
    assert isinstance(mixer, SwinAttention) and mixer.shift == 2 and mixer.mixer_name == "swin"
    assert create_mixer("swin", DIM, HEADS, layer_idx=2).shift == 0
    with pytest.raises(ValueError, match="no option"):
        create_mixer("swin", DIM, HEADS, input_resolution=(14, 14))


def test_wrong_token_count_raises():
    with pytest.raises(ValueError, match="grid"):
        make()(tokens((4, 4)), (4, 5))


@pytest.mark.parametrize("layer_idx", [0, 1])
@pytest.mark.parametrize("grid", [(1, 1), (5, 13), (14, 14)])
def test_gradient_reaches_every_parameter(grid, layer_idx):
    mixer = make(layer_idx).double()
    x = tokens(grid, dtype=torch.float64).requires_grad_()
    mixer(x, grid).square().sum().backward()
    for name, p in mixer.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name  # fully masked padded rows must not turn into NaN
    scale = largest([x.grad, *(p.grad for p in mixer.parameters())])
    for name, p in mixer.named_parameters():
        if name != "relative_position_bias_table" or grid != (1, 1):  # a 1x1 grid only uses offset (0, 0)
            assert clearly_non_zero(p.grad, scale), name
    assert torch.isfinite(x.grad).all() and clearly_non_zero(x.grad, scale)


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_batch_items_independent(layer_idx):
    grid = (9, 10)
    mixer = make(layer_idx)
    x = tokens(grid, batch=3)
    out = mixer(x, grid)
    for b in range(3):
        torch.testing.assert_close(mixer(x[b:b + 1], grid), out[b:b + 1], rtol=1e-5, atol=1e-6)
    y = x.clone()
    y[1] = torch.randn_like(y[1]) * 10
    out_y = mixer(y, grid)
    torch.testing.assert_close(out_y[[0, 2]], out[[0, 2]], rtol=1e-5, atol=1e-6)


def test_state_dict_holds_only_parameters():
    mixer = make(1)
    for grid in GRIDS:
        mixer(tokens(grid), grid)
    assert mixer._cache  # something was cached...
    assert set(mixer.state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
                                       "relative_position_bias_table"}  # ...but none of it is saved
    assert list(mixer.buffers()) == []
    fresh = make(1, seed=5)
    fresh.load_state_dict(mixer.state_dict())
    grid = (6, 11)
    torch.testing.assert_close(fresh(tokens(grid), grid), mixer(tokens(grid), grid))


@pytest.mark.parametrize("layer_idx", [0, 1])
@pytest.mark.parametrize("grid,window_size", [
    ((14, 14), 7), ((8, 8), 4), ((6, 9), 3),  # divisible
    ((7, 9), 7), ((5, 13), 4), ((10, 3), 4), ((1, 1), 7), ((11, 11), 5), ((13, 7), 2),  # padded
])
def test_matches_pairwise_reference(grid, window_size, layer_idx):
    mixer = make(layer_idx, window_size)
    x = tokens(grid)
    torch.testing.assert_close(mixer(x, grid).double(), reference(mixer, x, grid), rtol=1e-5, atol=1e-5)


def test_reference_masks_something():
    """Guards the reference itself: on a shifted, padded grid some pairs in a window must be masked."""
    grid = (9, 9)
    shifted, plain = make(1, 7), make(0, 7)
    plain.load_state_dict(shifted.state_dict())
    x = tokens(grid)
    assert not torch.allclose(reference(shifted, x, grid), reference(plain, x, grid), atol=1e-3)


@pytest.mark.parametrize("shift", [0, 2, 3])
@pytest.mark.parametrize("grid,window_size", [((14, 14), 7), ((7, 9), 7), ((4, 4), 7), ((1, 1), 7),
                                              ((10, 3), 4), ((13, 7), 6)])
def test_window_groups_hold_each_real_token_once(grid, window_size, shift):
    """No window holds a padded token, and `order` puts every token's output back where it came from."""
    if shift >= window_size:
        pytest.skip("a shift is less than the window")
    groups, order = swin_module.window_groups(grid, window_size, shift)
    flat = torch.cat([g.tokens.flatten() for g in groups])
    assert sorted(flat.tolist()) == list(range(grid[0] * grid[1]))
    assert torch.equal(flat[order], torch.arange(grid[0] * grid[1]))
    for g in groups:
        L = g.tokens.shape[1]
        assert 1 <= L <= window_size ** 2 and g.bias_index.shape == (L, L)
        assert g.mask is None or g.mask.shape == (g.tokens.shape[0], L, L)
        if shift == 0:
            assert g.mask is None
    divides = grid[0] % window_size == 0 and grid[1] % window_size == 0
    kinds_per_axis = 2 if shift == 0 else 3  # full and partial windows; shifted, the padding can fall inside one
    assert len(groups) == 1 if divides else 1 <= len(groups) <= kinds_per_axis ** 2  # one SDPA call where it divides


def test_no_work_on_padding():
    """A grid inside one window costs what global attention over its tokens costs, not a whole padded window."""
    swin, attention = SwinAttention(DIM, HEADS, window_size=7), create_mixer("attention", DIM, HEADS)
    assert swin.macs((4, 4)) == attention.macs((4, 4))
    assert swin.macs((4, 4)) < swin.macs((7, 7))


def test_compiles_its_window_groups():
    """Under torch.compile, a grid the window does not divide (several window groups, a Python loop over them)
    traces into as many graphs as one it divides: a graph break inside the loop would send the whole forward back to
    eager (the backend label once did, making compiled swin slower than eager there)."""
    import torch._dynamo

    def graphs(grid):
        torch._dynamo.reset()
        mixer = make(layer_idx=1)
        return torch._dynamo.explain(mixer)(tokens(grid), grid).graph_count

    assert graphs((9, 9)) == graphs((7, 7))


@pytest.mark.parametrize("layer_idx", [0, 1])
@pytest.mark.parametrize("grid,window_size", [((14, 14), 7), ((7, 7), 7), ((8, 12), 4), ((6, 9), 3)])
def test_matches_timm(grid, window_size, layer_idx):
    """Parity with timm's `SwinTransformerBlock._attn` (its roll, partition, -100 mask and `WindowAttention`)."""
    from timm.models.swin_transformer import SwinTransformerBlock

    mixer = make(layer_idx, window_size)
    block = SwinTransformerBlock(DIM, input_resolution=grid, num_heads=HEADS, window_size=window_size,
                                 shift_size=mixer.shift, always_partition=True)
    block.attn.load_state_dict(mixer.state_dict())
    block.eval()
    x = tokens(grid)
    B, N, C = x.shape
    with torch.no_grad():
        expected = block._attn(x.view(B, *grid, C)).reshape(B, N, C)  # (B, N, C)
        torch.testing.assert_close(mixer(x, grid), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer_idx", [0, 1])
@pytest.mark.parametrize("grid,window_size", [((14, 14), 7), ((7, 9), 7), ((5, 13), 4), ((1, 1), 7),
                                              ((24, 24), 7)])
def test_macs_match_flop_counter(grid, window_size, layer_idx):
    mixer = make(layer_idx, window_size)
    x = tokens(grid, batch=1)
    with FlopCounterMode(display=False) as counter:
        mixer(x, grid)
    assert counter.get_total_flops() == 2 * mixer.macs(grid)
    assert isinstance(mixer.macs(grid), int)


def test_macs_formula_at_a_known_point():
    """ViT-S width at 224 px / patch 16: 14 x 14 tokens, two 7 x 7 windows per side, no padding."""
    mixer = SwinAttention(384, 6, window_size=7)
    N, C, L = 196, 384, 49
    assert mixer.macs((14, 14)) == 4 * N * C * C + 2 * N * L * C


def test_impl_names_the_backend():
    mixer = make(1)
    grid = (7, 7)
    with sdpa_kernel(SDPBackend.MATH):
        mixer(tokens(grid), grid)
    assert mixer.impl == "sdpa_math"
