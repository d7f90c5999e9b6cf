"""The playground's mixing maps against brute force: each map rebuilds its mixer's own output."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from experiments.playground.mixing import (
    attention_matrix, conv_row, family_of, gradient_row, linear_matrix, mixing_rows, neighborhood_matrix, swin_matrix,
)
from experiments.playground.recurrences import gla_matrices, mamba2_matrices, mamba_matrices, vmamba_matrices
from mixers import TokenMixer, create_mixer, list_mixers
from mixers.ops.selective_scan import selective_scan_reference

DIM, HEADS = 16, 2


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def tokens(grid: tuple[int, int], seed: int = 1) -> torch.Tensor:
    return torch.randn(1, grid[0] * grid[1], DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def mixer64(name: str, **options: object) -> nn.Module:
    torch.manual_seed(0)
    return create_mixer(name, DIM, HEADS, **options).double().eval()


def values(mixer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """v of an attention-like mixer, (B, heads, N, head_dim)."""
    return rearrange(mixer.qkv(x), "b n (three h d) -> three b h n d", three=3, h=mixer.num_heads)[2]


def rebuilt(mixer: nn.Module, matrix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return mixer.proj(rearrange(matrix @ values(mixer, x), "b h n d -> b n (h d)"))


@pytest.mark.parametrize("name", ["attention", "attention_naive"])
@pytest.mark.parametrize("scaled", [True, False])
def test_attention_row_is_the_softmax_computed_directly(name: str, scaled: bool) -> None:
    grid = (3, 5)
    mixer, x = mixer64(name), tokens(grid)
    matrix = attention_matrix(mixer, x, scaled=scaled)
    q, k, _ = rearrange(mixer.qkv(x), "b n (three h d) -> three b h n d", three=3, h=HEADS)
    scale = (DIM // HEADS) ** -0.5 if scaled else 1.0
    for h in range(HEADS):
        for i in (0, 7, 14):
            logits = torch.tensor([scale * float(q[0, h, i] @ k[0, h, j]) for j in range(15)], dtype=torch.float64)
            direct = logits.exp() / logits.exp().sum()
            torch.testing.assert_close(matrix[0, h, i], direct, rtol=1e-12, atol=1e-14)
    if scaled:
        torch.testing.assert_close(rebuilt(mixer, matrix, x), mixer(x, grid), rtol=1e-10, atol=1e-12)


def window_members(grid: tuple[int, int], window_size: int, shift: int) -> list[set[int]]:
    """Token sets of each window, by padding and rolling a grid of token ids the way the Swin paper does."""
    H, W = grid
    Hp, Wp = -(-H // window_size) * window_size, -(-W // window_size) * window_size
    ids = torch.full((Hp, Wp), -1)
    ids[:H, :W] = torch.arange(H * W).view(H, W)
    ids = torch.roll(ids, shifts=(-shift, -shift), dims=(0, 1))
    windows = rearrange(ids, "(nh wh) (nw ww) -> (nh nw) (wh ww)", wh=window_size, ww=window_size)
    return [{int(t) for t in w if t >= 0} for w in windows]


@pytest.mark.parametrize("grid, layer_idx", [((8, 8), 0), ((8, 8), 1), ((6, 5), 0), ((6, 5), 1)])
def test_swin_is_zero_outside_the_window_and_rebuilds_the_mixer(grid: tuple[int, int], layer_idx: int) -> None:
    mixer, x = mixer64("swin", window_size=4, layer_idx=layer_idx), tokens(grid)
    matrix = swin_matrix(mixer, x, grid)
    members = window_members(grid, 4, mixer.shift)
    for i in range(grid[0] * grid[1]):
        window = next(w for w in members if i in w)
        outside = [j for j in range(grid[0] * grid[1]) if j not in window]
        assert matrix[0, :, i, outside].abs().max() == 0  # exactly zero, not small
        assert matrix[0, :, i, i].min() > 0
    torch.testing.assert_close(matrix.sum(-1), torch.ones_like(matrix.sum(-1)))
    torch.testing.assert_close(rebuilt(mixer, matrix, x), mixer(x, grid), rtol=1e-10, atol=1e-12)


def test_swin_scale_removed_is_the_unscaled_softmax_of_the_same_window() -> None:
    grid = (8, 8)
    mixer, x = mixer64("swin", window_size=4), tokens(grid)
    scaled, unscaled = swin_matrix(mixer, x, grid), swin_matrix(mixer, x, grid, scaled=False)
    assert torch.equal(scaled > 0, unscaled > 0)
    assert not torch.allclose(scaled, unscaled)


def test_linear_equals_the_explicit_product() -> None:
    grid = (4, 3)
    mixer, x = mixer64("linear"), tokens(grid)
    matrix = linear_matrix(mixer, x)
    q, k, _ = rearrange(mixer.qkv(x), "b n (three h d) -> three b h n d", three=3, h=HEADS)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    n = grid[0] * grid[1]
    for h in range(HEADS):
        for i in range(n):
            normaliser = float(phi_q[0, h, i] @ phi_k[0, h].sum(0)) + n * mixer.eps
            for j in range(n):
                assert float(matrix[0, h, i, j]) == pytest.approx(float(phi_q[0, h, i] @ phi_k[0, h, j]) / normaliser,
                                                                  rel=1e-12)
    # The mixer keeps its state in float32 even for float64 tokens (mixers/linear.py): float32 round-off.
    torch.testing.assert_close(rebuilt(mixer, matrix, x), mixer(x, grid), rtol=1e-5, atol=1e-8)


def test_mamba_unrolled_matrix_applied_to_u_is_the_scan_of_each_direction() -> None:
    grid = (3, 4)
    mixer, x = mixer64("mamba", d_state=4, expand=1), tokens(grid)
    forward, backward = mamba_matrices(mixer, x)
    L = grid[0] * grid[1]
    assert torch.equal(forward.matrix, forward.matrix.tril())  # j <= i only
    assert torch.equal(backward.matrix, backward.matrix.triu())  # j >= i only
    # The scan's own inputs, formed independently of the playground, then the float64 reference scan (no D, no z).
    xz = rearrange(mixer.in_proj(x), "b l d -> b d l")
    x_in, _ = xz.chunk(2, dim=1)
    for direction, seq, conv, x_proj, dt_proj, A_log, flip in (
        (forward, x_in, mixer.conv1d, mixer.x_proj, mixer.dt_proj, mixer.A_log, False),
        (backward, x_in.flip(-1), mixer.conv1d_b, mixer.x_proj_b, mixer.dt_proj_b, mixer.A_b_log, True),
    ):
        u = F.silu(conv(seq)[..., :L])
        dt, B, C = torch.split(x_proj(rearrange(u, "b d l -> b l d")), [mixer.dt_rank, 4, 4], dim=-1)
        y = selective_scan_reference(u, rearrange(F.linear(dt, dt_proj.weight), "b l d -> b d l"),
                                     -torch.exp(A_log), rearrange(B, "b l n -> b n l"), rearrange(C, "b l n -> b n l"),
                                     delta_bias=dt_proj.bias, delta_softplus=True)
        y = y.flip(-1) if flip else y
        torch.testing.assert_close(torch.einsum("bdij,bdj->bdi", direction.matrix, direction.u), y,
                                   rtol=1e-10, atol=1e-12)


def test_mamba_matrices_rebuild_the_whole_mixer() -> None:
    grid = (4, 4)
    mixer, x = mixer64("mamba", d_state=4, expand=2), tokens(grid)
    f, b = mamba_matrices(mixer, x)

    def direction(d) -> torch.Tensor:
        return d.gate * (torch.einsum("bdij,bdj->bdi", d.matrix, d.u) + d.skip[:, None] * d.u)  # (B, D, L)

    y = (direction(f) + direction(b)) / 2
    torch.testing.assert_close(mixer.out_proj(rearrange(y, "b d l -> b l d")), mixer(x, grid), rtol=1e-9, atol=1e-11)


class FixedMixing(TokenMixer):
    """y = M x W: a token mixer whose Jacobian blocks are M_ij W^T, so ||J_ij||_F = |M_ij| ||W||_F."""

    def __init__(self, matrix: torch.Tensor) -> None:
        super().__init__()
        self.matrix = matrix
        self.weight = nn.Parameter(torch.randn(DIM, DIM, dtype=torch.float64))

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        return self.matrix @ x @ self.weight


def test_gradient_fallback_is_the_jacobian_block_norm() -> None:
    grid = (3, 3)
    matrix = torch.randn(9, 9, dtype=torch.float64)
    matrix[4, 2] = 0.0
    mixer = FixedMixing(matrix)
    assert family_of(mixer) == "gradient"
    row = gradient_row(mixer, tokens(grid), grid, 4)
    torch.testing.assert_close(row, matrix[4].abs() * mixer.weight.norm().detach(), rtol=1e-12, atol=0)
    assert row[2] == 0
    shown = mixing_rows(mixer, tokens(grid), grid, 4)
    assert shown.family == "gradient" and torch.equal(shown.rows[0], row)


def test_gradient_fallback_agrees_with_swin_on_where_the_window_ends() -> None:
    grid = (8, 8)
    mixer, x = mixer64("swin", window_size=4, layer_idx=1), tokens(grid)
    for query in (0, 27, 63):
        assert torch.equal(gradient_row(mixer, x, grid, query) > 0, swin_matrix(mixer, x, grid)[0, 0, query] > 0)


def test_conv_row_reads_the_three_by_three_neighbourhood_cropped_at_the_border() -> None:
    row = conv_row((4, 5), 0).view(4, 5)
    assert (row > 0).sum() == 4 and row[:2, :2].min() == 1 / 9
    assert (conv_row((4, 5), 7) > 0).sum() == 9


@pytest.mark.parametrize("name", list_mixers())
def test_every_registered_mixer_gets_a_row_per_map(name: str) -> None:
    grid = (4, 4)
    torch.manual_seed(0)
    mixer = create_mixer(name, DIM, HEADS, **({"window_size": 2} if name == "swin" else {})).eval()
    shown = mixing_rows(mixer, tokens(grid).float(), grid, 5)
    assert shown.rows.shape == (len(shown.map_names), 16)
    assert torch.isfinite(shown.rows).all() and shown.rows.min() >= 0 and shown.rows.max() > 0
    if shown.family in ("attention", "swin"):
        torch.testing.assert_close(shown.rows.sum(-1), torch.ones(len(shown.map_names), dtype=torch.float64))


def test_mixing_rows_refuses_a_query_outside_the_grid() -> None:
    with pytest.raises(ValueError, match="outside the 2 x 2 grid"):
        mixing_rows(copy.deepcopy(mixer64("linear")), tokens((2, 2)), (2, 2), 4)


@pytest.mark.parametrize("grid, kernel_size", [((6, 7), 3), ((5, 5), 7), ((8, 8), 5)])
def test_neighborhood_is_zero_outside_the_neighbourhood_and_rebuilds_the_mixer(grid: tuple[int, int],
                                                                               kernel_size: int) -> None:
    mixer, x = mixer64("neighborhood", kernel_size=kernel_size), tokens(grid)
    with torch.no_grad():
        mixer.rpb.normal_(0, 1)  # a bias far from its near-zero init, so a misplaced offset shows
    matrix = neighborhood_matrix(mixer, x, grid)
    H, W = grid
    kh, kw = min(kernel_size, H), min(kernel_size, W)
    for i in (0, W + 1, H * W - 1):
        r, c = divmod(i, W)
        r0, c0 = min(max(r - kernel_size // 2, 0), H - kh), min(max(c - kernel_size // 2, 0), W - kw)
        inside = {rr * W + cc for rr in range(r0, r0 + kh) for cc in range(c0, c0 + kw)}
        outside = [j for j in range(H * W) if j not in inside]
        assert not outside or matrix[0, :, i, outside].abs().max() == 0  # exactly zero, not small
        assert matrix[0, :, i, sorted(inside)].min() > 0
    torch.testing.assert_close(rebuilt(mixer, matrix, x), mixer(x, grid), rtol=1e-10, atol=1e-12)


def test_vmamba_four_scans_rebuild_the_whole_mixer() -> None:
    grid = (3, 5)  # not square: row-major and column-major orders differ in length of their runs
    mixer, x = mixer64("vmamba", d_state=3, expand=2), tokens(grid)
    scans, z = vmamba_matrices(mixer, x, grid)
    assert len(scans) == 4
    L = grid[0] * grid[1]
    # The row-major scan is causal in token order; the reversed one anti-causal.
    assert torch.equal(scans[0].matrix, scans[0].matrix.tril())
    assert torch.equal(scans[2].matrix, scans[2].matrix.triu())
    # The column-major scan: token (r, c) hears (r', c') only if (c', r') <= (c, r), i.e. earlier in column order.
    order = torch.arange(L).view(grid).t().reshape(-1)  # column-major step -> token
    step = torch.argsort(order)
    later = step[None, :] > step[:, None]  # (L, L): j comes after i in the column-major scan
    assert scans[1].matrix[0, :, later].abs().max() == 0
    y = sum(torch.einsum("bdij,bdj->bdi", s.matrix, s.u) + s.skip[:, None] * s.u for s in scans)  # (B, D, L)
    y = mixer.out_norm(rearrange(y, "b d l -> b l d")) * F.silu(z)
    # float64 throughout: the matrix form and the scan differ only in the order they sum, ~1e-15 relative.
    torch.testing.assert_close(mixer.out_proj(y), mixer(x, grid), rtol=1e-9, atol=1e-11)


def test_gla_two_directions_rebuild_the_whole_mixer() -> None:
    grid = (4, 5)
    mixer, x = mixer64("gla", chunk_size=8), tokens(grid)
    forward, backward, v = gla_matrices(mixer, x)
    assert torch.equal(forward, forward.tril()) and torch.equal(backward, backward.triu())
    o = (forward + backward) @ v  # (B, heads, L, head_v_dim)
    o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + mixer.norm_eps) * mixer.g_norm_weight
    y = mixer.o_proj(rearrange(o, "b h l d -> b l (h d)") * F.silu(mixer.g_proj(x)))
    # float64 throughout (chunk_gla keeps float64 inputs in float64): only the order of summation differs.
    torch.testing.assert_close(y, mixer(x, grid), rtol=1e-9, atol=1e-11)


def mamba2_away_from_init(**options: object) -> nn.Module:
    """A mamba2 mixer off its init's symmetries (A = 1 and D = 1 for every head, unit norm weight), so that a head
    or a part taken for another shows."""
    mixer = mixer64("mamba2", **options)
    for p in mixer.parameters():
        p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype) * 0.1)
    return mixer


@pytest.mark.parametrize("grid, options", [((3, 5), {"chunk_size": 4, "d_state": 3}),
                                           ((4, 4), {"expand": 2, "headdim": 8, "d_conv": 5})])
def test_mamba2_quasiseparable_matrix_rebuilds_the_whole_mixer(grid: tuple[int, int], options: dict) -> None:
    mixer, x = mamba2_away_from_init(**options), tokens(grid)
    parts, u = mamba2_matrices(mixer, x)
    assert torch.equal(parts.forward, parts.forward.tril(-1)) and torch.equal(parts.backward, parts.backward.triu(1))
    y = rearrange(parts.whole() @ u, "b h l p -> b l (h p)")  # (B, L, d_inner)
    y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + mixer.norm_eps) * mixer.norm_weight
    y = mixer.out_proj(y * F.silu(mixer.in_proj(x)[..., :mixer.d_inner]))
    # float64 throughout (the mixer runs its SSD in float64 for float64 tokens, in chunks of 4 over 15 tokens in the
    # first case): only the order of summation differs, ~1e-15 relative.
    torch.testing.assert_close(y, mixer(x, grid), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name, options", [("mamba", {"d_state": 4, "expand": 1}),
                                           ("vmamba", {"d_state": 2, "expand": 1}), ("gla", {}),
                                           ("mamba2", {"chunk_size": 4})])
def test_recurrence_rows_are_the_mean_magnitudes_of_the_tested_matrices(name: str, options: dict) -> None:
    """The rows the page draws (one row unrolled per click) against the whole matrices rebuilt above."""
    grid = (3, 4)
    mixer = mamba2_away_from_init(**options) if name == "mamba2" else mixer64(name, **options)
    x = tokens(grid)
    if name == "mamba":
        f, b = mamba_matrices(mixer, x)
        fwd, bwd = f.matrix[0].abs().mean(0), b.matrix[0].abs().mean(0)  # (L, L)
        expected = torch.stack([(fwd + bwd) / 2, fwd, bwd])[None]  # (1 head, 3 views, L, L)
    elif name == "vmamba":
        scans, _ = vmamba_matrices(mixer, x, grid)
        each = torch.stack([s.matrix[0].abs().mean(0) for s in scans])  # (4, L, L)
        expected = torch.cat([each.sum(0, keepdim=True), each])[None]  # (1, 5, L, L)
    elif name == "gla":
        f, b, _ = gla_matrices(mixer, x)
        expected = torch.stack([(f + b).abs(), f.abs(), b.abs()], dim=2)[0]  # (heads, 3, L, L)
    else:
        parts, _ = mamba2_matrices(mixer, x)
        expected = torch.stack([parts.whole().abs(), parts.forward.abs(), parts.backward.abs(),
                                torch.diag_embed(parts.diagonal).abs()], dim=2)[0]  # (heads, 4, L, L)
    for query in (0, 5, 11):  # float64 both ways: a row and the whole matrix differ only in summation order
        shown = mixing_rows(mixer, x, grid, query)
        assert shown.family == name and shown.heads == expected.shape[0]
        assert len(shown.view_names) == expected.shape[1] and len(shown.map_names) == len(shown.rows)
        torch.testing.assert_close(shown.rows, expected[:, :, query].reshape(len(shown.rows), -1),
                                   rtol=1e-10, atol=1e-13)


def test_vmamba_gla_and_mamba2_views_are_labelled() -> None:
    grid = (4, 4)
    shown = mixing_rows(mixer64("vmamba"), tokens(grid), grid, 5)
    assert shown.map_names == ("all four scans", "row-major scan", "column-major scan", "row-major reversed",
                               "column-major reversed")
    shown = mixing_rows(mixer64("gla"), tokens(grid), grid, 5)
    assert shown.map_names[:4] == ("head 0, both directions", "head 0, forward", "head 0, backward",
                                   "head 1, both directions")
    shown = mixing_rows(mixer64("mamba2"), tokens(grid), grid, 5)
    assert shown.family == "mamba2" and shown.heads == HEADS
    assert shown.map_names[:5] == ("head 0, forward + backward + diagonal", "head 0, forward", "head 0, backward",
                                   "head 0, diagonal", "head 1, forward + backward + diagonal")
