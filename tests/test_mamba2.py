"""Mamba-2's SSD: the chunked form and the one-matrix form against the step-by-step recurrence, Hydra's
quasiseparable matrix against its definition entry by entry, and the Hydra-style bidirectional mixer against
references written out with that recurrence and as that matrix."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch.utils.flop_counter import FlopCounterMode

from mixers import create_mixer
from mixers.mamba2 import HydraMixer
from mixers.ops.gated_recurrence import unavailable_reason as cpp_unavailable_reason
from mixers.ops.ssd import (chunk_ssd, decay_matrix, hydra_matrix, naive_ssd, segsum, ssd_hydra_cpp,
                             ssd_matrix)

DIM, HEADS = 16, 2


def inputs(batch: int, length: int, heads: int, head_dim: int, d_state: int, dtype=torch.float64,
           decay_scale: float = 1.0) -> list[torch.Tensor]:
    x = torch.randn(batch, length, heads, head_dim, dtype=dtype)
    a = -F.softplus(torch.randn(batch, length, heads, dtype=dtype)) * decay_scale
    b, c = torch.randn(2, batch, length, d_state, dtype=dtype)
    return [t.requires_grad_() for t in (x, a, b, c)]


@pytest.mark.parametrize("length,chunk_size", [(37, 16), (5, 16), (16, 16), (23, 7), (1, 4), (30, 1), (65, 64)])
def test_chunk_matches_recurrence_forward_and_backward(length: int, chunk_size: int) -> None:
    tensors = inputs(2, length, 3, 5, 4)
    out = chunk_ssd(*tensors, chunk_size=chunk_size)
    ref = naive_ssd(*tensors)
    # float64 throughout: both sum the same O(L) terms in different orders, so they agree to ~1e-14 relative.
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    weight = torch.randn_like(out)
    grads = torch.autograd.grad((out * weight).sum(), tensors)
    ref_grads = torch.autograd.grad((ref * weight).sum(), tensors)
    for name, g, r in zip(("x", "a", "b", "c"), grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-11, msg=lambda m: f"d{name}: {m}")


def test_segsum_is_the_sum_of_each_segment() -> None:
    a = torch.randn(3, 6, dtype=torch.float64)
    seg = segsum(a)
    for i in range(6):
        for j in range(6):
            expected = a[:, j + 1 : i + 1].sum(-1) if j <= i else torch.full((3,), float("-inf"), dtype=a.dtype)
            torch.testing.assert_close(seg[:, i, j], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T", [1, 2, 7])
def test_decay_matrix_backward_matches_autograd(T: int) -> None:
    """The hand-written backward against autograd through exp(segsum(a)), and against finite differences."""
    a = (-torch.rand(2, 3, T, dtype=torch.float64)).requires_grad_()
    weight = torch.randn(2, 3, T, T, dtype=torch.float64)
    (mine,) = torch.autograd.grad((decay_matrix(a) * weight).sum(), a)
    (autograd,) = torch.autograd.grad((segsum(a).exp() * weight).sum(), a)
    torch.testing.assert_close(mine, autograd, rtol=1e-12, atol=1e-14)  # same sums, other order: float64 round-off
    assert torch.autograd.gradcheck(decay_matrix, (a,))


def test_chunk_is_stable_with_strong_decays_in_float32() -> None:
    """Decays summing far below float32's exp range (about -88) inside one chunk: a ratio of cumulative decays would
    overflow; segment sums only underflow to an exact 0."""
    tensors = inputs(1, 50, 2, 4, 3, dtype=torch.float32, decay_scale=100.0)
    assert tensors[1].detach().sum(1).min() < -200
    out = chunk_ssd(*tensors, chunk_size=16)
    assert torch.isfinite(out).all()
    ref = naive_ssd(*(t.detach().double() for t in tensors))
    # float32 against float64: relative round-off of a few 1e-7 on outputs of order 1-10.
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in tensors)


def test_chunk_keeps_half_precision_inputs_dtype() -> None:
    tensors = [t.detach().to(torch.bfloat16) for t in inputs(1, 9, 1, 4, 4)]
    assert chunk_ssd(*tensors, chunk_size=4).dtype == torch.bfloat16


def test_ssd_matrix_applied_to_x_is_the_recurrence() -> None:
    x, a, b, c = (t.detach() for t in inputs(2, 13, 3, 5, 4))
    y = torch.einsum("zhij,zjhp->zihp", ssd_matrix(a, b, c), x)
    # float64 both ways, the same terms summed in another order: ~1e-15 relative.
    torch.testing.assert_close(y, naive_ssd(x, a, b, c), rtol=1e-10, atol=1e-12)


def quasiseparable_entries(A: torch.Tensor, diagonal: torch.Tensor, dt_f: torch.Tensor, B_f: torch.Tensor,
                           C_f: torch.Tensor, dt_b: torch.Tensor, B_b: torch.Tensor, C_b: torch.Tensor) -> torch.Tensor:
    """Hydra's quasiseparable matrix (B, H, L_t, L_s) entry by entry, with no recurrence and no flip: below the
    diagonal (c_{t-1} . b_s) exp(a_{s+1} + ... + a_{t-1}) dt_s of the forward maps, above it (c_{t+1} . b_s)
    exp(a_{t+1} + ... + a_{s-1}) dt_s of the backward maps, on it the diagonal weight; a = dt A."""
    batch, length, H = dt_f.shape
    a_f, a_b = dt_f * A, dt_b * A  # (B, L, H)
    matrix = torch.zeros(batch, H, length, length, dtype=dt_f.dtype)  # (B, H, L_t, L_s)
    for t in range(length):
        matrix[:, :, t, t] = diagonal[:, t]
        for s in range(t):
            decay = a_f[:, s + 1 : t].sum(1).exp()  # (B, H), 1 for s = t - 1
            matrix[:, :, t, s] = (C_f[:, t - 1] * B_f[:, s]).sum(-1)[:, None] * decay * dt_f[:, s]
        for s in range(t + 1, length):
            decay = a_b[:, t + 1 : s].sum(1).exp()  # (B, H)
            matrix[:, :, t, s] = (C_b[:, t + 1] * B_b[:, s]).sum(-1)[:, None] * decay * dt_b[:, s]
    return matrix


@pytest.mark.parametrize("length", [1, 2, 9])
def test_hydra_matrix_is_its_definition_entry_by_entry(length: int) -> None:
    batch, H, N = 2, 3, 4
    A = -torch.rand(H, dtype=torch.float64) * 2
    diagonal = torch.randn(batch, length, H, dtype=torch.float64)
    dt_f, dt_b = F.softplus(torch.randn(2, batch, length, H, dtype=torch.float64))
    B_f, C_f, B_b, C_b = torch.randn(4, batch, length, N, dtype=torch.float64)
    parts = hydra_matrix(A, diagonal, dt_f, B_f, C_f, dt_b, B_b, C_b)
    assert torch.equal(parts.forward, parts.forward.tril(-1)) and torch.equal(parts.backward, parts.backward.triu(1))
    # float64 both ways; segment sums added in another order: ~1e-15 relative.
    torch.testing.assert_close(parts.whole(), quasiseparable_entries(A, diagonal, dt_f, B_f, C_f, dt_b, B_b, C_b),
                               rtol=1e-12, atol=1e-14)


def hydra_reference(m: HydraMixer, x: torch.Tensor, form: str = "recurrence") -> torch.Tensor:
    """The mixer written out independently of its code.

    `recurrence`: each direction a causal SSD (`naive_ssd`) shifted one token, the backward one on the reversed
    sequence, plus the per-head diagonal. `matrix`: Hydra's quasiseparable matrix (`hydra_matrix`, checked entry
    by entry against its definition by `test_hydra_matrix_is_its_definition_entry_by_entry`) times u, with no
    recurrence. Then RMSNorm, times silu(z), out_proj.
    """
    d_inner, N, H = m.d_inner, m.d_state, m.nheads
    projected = m.in_proj(x)
    z, dt = projected[..., :d_inner], projected[..., -2 * H :]
    xbc = projected[..., d_inner : 2 * d_inner + 4 * N].transpose(1, 2)
    xbc = F.silu(F.conv1d(xbc, m.conv1d.weight, m.conv1d.bias, padding=m.d_conv // 2, groups=xbc.shape[1]))
    u, B_f, C_f, B_b, C_b = xbc.transpose(1, 2).split([d_inner, N, N, N, N], dim=-1)
    dt_f, dt_b = F.softplus(dt[..., :H] + m.dt_bias), F.softplus(dt[..., H:] + m.dt_bias)  # (B, L, H)
    A = -torch.exp(m.A_log)
    u_heads = rearrange(u, "b l (h p) -> b l h p", h=H)
    diagonal = u @ m.fc_D.weight.T + m.D  # (B, L, H)

    if form == "recurrence":
        def shifted_ssd(u: torch.Tensor, B: torch.Tensor, C: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
            y = naive_ssd(u * dt[..., None], dt * A, B, C)  # (B, L, H, P)
            return torch.cat([torch.zeros_like(y[:, :1]), y[:, :-1]], dim=1)  # token t reads the state through t - 1

        forward = shifted_ssd(u_heads, B_f, C_f, dt_f)
        backward = shifted_ssd(u_heads.flip(1), B_b.flip(1), C_b.flip(1), dt_b.flip(1)).flip(1)
        y = forward + backward + u_heads * diagonal[..., None]
    else:
        matrix = hydra_matrix(A, diagonal, dt_f, B_f, C_f, dt_b, B_b, C_b).whole()  # (B, H, L, L)
        y = rearrange(matrix @ rearrange(u_heads, "b l h p -> b h l p"), "b h l p -> b l h p")
    y = rearrange(y, "b l h p -> b l (h p)")
    y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + m.norm_eps) * m.norm_weight * F.silu(z)
    return m.out_proj(y)


@pytest.mark.parametrize("grid,options", [
    ((1, 1), {}), ((5, 7), {"chunk_size": 16}), ((3, 11), {"chunk_size": 4}), ((4, 4), {}),
    ((3, 5), {"expand": 2, "headdim": 8, "d_state": 3, "d_conv": 5, "chunk_size": 6, "bias": True}),
])
def test_mixer_matches_recurrence_forward_and_backward(grid: tuple[int, int], options: dict) -> None:
    mixer = create_mixer("mamba2", DIM, HEADS, **options).double()
    with torch.no_grad():
        for p in mixer.parameters():  # away from the init's symmetries (A = 1, D = 1, unit norm weight)
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, grid[0] * grid[1], DIM, dtype=torch.float64, requires_grad=True)
    out = mixer(x, grid)
    ref = hydra_reference(mixer, x)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)
    params = [x, *mixer.parameters()]
    weight = torch.randn_like(out)
    grads = torch.autograd.grad((out * weight).sum(), params)
    ref_grads = torch.autograd.grad((ref * weight).sum(), params)
    names = ["x", *(name for name, _ in mixer.named_parameters())]
    for name, g, r in zip(names, grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-10, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("grid,options", [((1, 1), {}), ((2, 5), {"chunk_size": 3}), ((3, 3), {"d_state": 2})])
def test_mixer_is_one_quasiseparable_matrix(grid: tuple[int, int], options: dict) -> None:
    """Hydra's definition (the matrix checked entry by entry above): checks the mixer's flips, one-token shifts and
    chunks against no recurrence."""
    mixer = create_mixer("mamba2", DIM, HEADS, **options).double()
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, grid[0] * grid[1], DIM, dtype=torch.float64)
    torch.testing.assert_close(mixer(x, grid), hydra_reference(mixer, x, form="matrix"), rtol=1e-9, atol=1e-11)


def test_both_directions_reach_across_the_sequence() -> None:
    """The first token hears the last (backward SSD) and the last the first (forward SSD), beyond the conv's reach."""
    mixer = create_mixer("mamba2", DIM, HEADS).double()
    x = torch.randn(1, 12, DIM, dtype=torch.float64, requires_grad=True)
    out = mixer(x, (3, 4))
    (first,) = torch.autograd.grad(out[0, 0].sum(), x, retain_graph=True)
    (last,) = torch.autograd.grad(out[0, -1].sum(), x)
    scale = max(first.abs().max().item(), last.abs().max().item())
    # a real path at initialisation is 1e-4..1e-3 of the largest gradient; float64 round-off would be ~1e-16 of it.
    assert first[0, -1].abs().max() > 1e-8 * scale and last[0, 0].abs().max() > 1e-8 * scale


def test_bfloat16_mixer_keeps_dtype() -> None:
    mixer = create_mixer("mamba2", DIM, HEADS).to(torch.bfloat16)
    out = mixer(torch.randn(2, 20, DIM, dtype=torch.bfloat16), (4, 5))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize("impl", ["chunk_torch", "cpp_loop"])
def test_runs_under_autocast_with_the_ssd_in_float32(monkeypatch: pytest.MonkeyPatch, impl: str) -> None:
    """bf16 autocast on the CPU: the projections run in bf16, the SSD with autocast off on float32 inputs. bf16 keeps
    8 bits of mantissa (relative round-off ~4e-3 per product), so a few such layers stay within 2e-2 of float64."""
    import mixers.mamba2

    if impl == "cpp_loop" and cpp_unavailable_reason(torch.device("cpu")) is not None:
        pytest.skip(f"the compiled recurrence is unavailable: {cpp_unavailable_reason(torch.device('cpu'))}")
    seen = []

    def recording(ssd):
        def record(*args: torch.Tensor, **kwargs: int) -> torch.Tensor:
            seen.append(({t.dtype for t in args}, torch.is_autocast_enabled("cpu")))
            return ssd(*args, **kwargs)
        return record

    monkeypatch.setattr(mixers.mamba2, "chunk_ssd", recording(chunk_ssd))
    monkeypatch.setattr(mixers.mamba2, "ssd_hydra_cpp", recording(ssd_hydra_cpp))
    mixer = create_mixer("mamba2", DIM, HEADS, impl=impl)
    x = torch.randn(1, 64, DIM)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mixer(x, (8, 8))
    assert seen == [({torch.float32}, False)]
    assert torch.isfinite(out).all()
    reference = mixer.double()(x.double(), (8, 8))
    assert (out.double() - reference).norm() / reference.norm() < 2e-2


def test_macs_match_flop_counter_with_options() -> None:
    """The contract test checks the defaults; here every width the formula reads differs, and chunks do not divide."""
    mixer = create_mixer("mamba2", DIM, HEADS, expand=2, headdim=8, d_state=5, d_conv=5, chunk_size=7).eval()
    grid = (5, 9)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        mixer(torch.randn(1, 45, DIM), grid)
    assert mixer.macs(grid) == counter.get_total_flops() // 2


@pytest.mark.parametrize("preset", ["micro", "tiny"])
def test_default_parameters_match_attention(preset: str) -> None:
    """The docstring's claim: expand 1 and d_state = dim / 4 hold attention's parameter count within 5%."""
    from models.vit import PRESETS

    cfg = PRESETS[preset]
    attention = sum(p.numel() for p in create_mixer("attention", cfg.dim, cfg.num_heads).parameters())
    mamba2 = sum(p.numel() for p in create_mixer("mamba2", cfg.dim, cfg.num_heads).parameters())
    assert abs(mamba2 / attention - 1) < 0.05


def test_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="d_conv must be odd"):
        create_mixer("mamba2", DIM, HEADS, d_conv=4)
    with pytest.raises(ValueError, match="multiple of headdim"):
        create_mixer("mamba2", DIM, HEADS, headdim=5)
    with pytest.raises(ValueError, match="chunk_size and d_state"):
        create_mixer("mamba2", DIM, HEADS, chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        chunk_ssd(*inputs(1, 3, 1, 2, 2), chunk_size=0)
