"""The compiled gated recurrence (`mixers/ops/gated_recurrence`) through its two ops, GLA's (`gla_recurrent_cpp`,
one decay per key) and SSD's (`ssd_recurrent_cpp`, one per head, B and C shared by the heads): forward and every
gradient against the step-by-step references in float64, at odd lengths and widths and on strided views; float32
and half inputs; opcheck and gradcheck; the counters; and the mixers' choice of it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from mixers import create_mixer
from mixers.ops.gated_recurrence import unavailable_reason
from mixers.ops.gla import chunk_gla_macs, gla_both_ways_cpp, gla_recurrent_cpp, naive_recurrent_gla
from mixers.ops.ssd import chunk_ssd_macs, naive_ssd, ssd_hydra_cpp, ssd_recurrent_cpp

pytestmark = pytest.mark.skipif(unavailable_reason(torch.device("cpu")) is not None,
                                reason=f"the compiled recurrence is unavailable: "
                                       f"{unavailable_reason(torch.device('cpu'))}")


def gla_inputs(batch: int, heads: int, length: int, keys: int, values: int, dtype=torch.float64,
               gate_scale: float = 1.0) -> list[torch.Tensor]:
    q, k = torch.randn(2, batch, heads, length, keys, dtype=dtype)
    v = torch.randn(batch, heads, length, values, dtype=dtype)
    g = F.logsigmoid(torch.randn(batch, heads, length, keys, dtype=dtype)) * gate_scale
    return [t.requires_grad_() for t in (q, k, v, g)]


def ssd_inputs(batch: int, length: int, heads: int, head_dim: int, d_state: int, dtype=torch.float64
               ) -> list[torch.Tensor]:
    x = torch.randn(batch, length, heads, head_dim, dtype=dtype)
    a = -F.softplus(torch.randn(batch, length, heads, dtype=dtype))
    b, c = torch.randn(2, batch, length, d_state, dtype=dtype)
    return [t.requires_grad_() for t in (x, a, b, c)]


def assert_same_with_gradients(out: torch.Tensor, ref: torch.Tensor, inputs: list[torch.Tensor], **tolerance) -> None:
    torch.testing.assert_close(out, ref, **tolerance)
    grad_out = torch.randn_like(ref)
    got = torch.autograd.grad(out, inputs, grad_out)
    want = torch.autograd.grad(ref, inputs, grad_out)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, **tolerance, msg=lambda m: f"gradient {i}: {m}")


@pytest.mark.parametrize("batch,heads,length,keys,values", [(2, 3, 37, 5, 7), (1, 2, 1, 16, 32), (2, 1, 64, 4, 1),
                                                            (3, 2, 19, 9, 17)])
def test_gla_matches_the_recurrence_forward_and_backward(batch: int, heads: int, length: int, keys: int,
                                                         values: int) -> None:
    tensors = gla_inputs(batch, heads, length, keys, values)
    assert_same_with_gradients(gla_recurrent_cpp(*tensors), naive_recurrent_gla(*tensors), tensors)


def test_gla_reads_strided_views_and_a_given_scale() -> None:
    """The mixer hands (B, L, H, K) projections as (B, H, L, K) views: no copy is needed and none changes a value."""
    batch, length, heads, keys = 2, 11, 3, 4
    leaves = [torch.randn(batch, length, heads, keys, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    gate = F.logsigmoid(torch.randn(batch, length, heads, 2 * keys, dtype=torch.float64))[..., :keys]
    gate.requires_grad_()
    q, k, v = (t.transpose(1, 2) for t in leaves)
    g = gate.transpose(1, 2)
    assert not q.is_contiguous() and g.stride(-1) == 1
    out = gla_recurrent_cpp(q, k, v, g, scale=0.3)
    assert_same_with_gradients(out, naive_recurrent_gla(q, k, v, g, scale=0.3), [*leaves, gate])


def test_gla_strong_decays_stay_finite_and_exact() -> None:
    """Decays far below float32's exp range flush the state to zero, as exp underflows; nothing becomes NaN."""
    tensors = gla_inputs(2, 2, 23, 4, 5, dtype=torch.float32, gate_scale=300.0)
    out = gla_recurrent_cpp(*tensors)
    ref = naive_recurrent_gla(*(t.double() for t in tensors))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.sum(), tensors)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("batch,length,heads,head_dim,d_state", [(2, 37, 3, 5, 4), (1, 1, 1, 1, 1), (2, 64, 2, 32, 16),
                                                                  (3, 13, 4, 3, 1)])
def test_ssd_matches_the_recurrence_forward_and_backward(batch: int, length: int, heads: int, head_dim: int,
                                                         d_state: int) -> None:
    tensors = ssd_inputs(batch, length, heads, head_dim, d_state)
    assert_same_with_gradients(ssd_recurrent_cpp(*tensors), naive_ssd(*tensors), tensors)


def test_ssd_takes_b_and_c_as_views_of_one_projection() -> None:
    """mamba2 splits B and C off one conv output: views with a time stride of 2N, shared by every head."""
    x, a, _, _ = ssd_inputs(2, 9, 3, 4, 5)
    bc = torch.randn(2, 9, 10, dtype=torch.float64, requires_grad=True)
    b, c = bc.split(5, dim=-1)
    assert_same_with_gradients(ssd_recurrent_cpp(x, a, b, c), naive_ssd(x, a, b, c), [x, a, bc])


def test_float32_and_half_inputs_are_computed_in_float32() -> None:
    gla = gla_inputs(2, 2, 33, 8, 16)
    ssd = ssd_inputs(2, 33, 2, 8, 4)
    for op, ref, tensors in ((gla_recurrent_cpp, naive_recurrent_gla, gla), (ssd_recurrent_cpp, naive_ssd, ssd)):
        expected = ref(*tensors)
        out32 = op(*(t.float() for t in tensors))
        assert out32.dtype == torch.float32
        torch.testing.assert_close(out32.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
        out16 = op(*(t.bfloat16() for t in tensors))
        assert out16.dtype == torch.bfloat16 and torch.isfinite(out16.float()).all()


@pytest.mark.parametrize("batch,heads,length,keys,values", [(2, 3, 37, 5, 7), (1, 2, 1, 16, 32), (3, 2, 19, 9, 17)])
def test_gla_both_ways_is_the_causal_plus_the_flipped_causal(batch: int, heads: int, length: int, keys: int,
                                                              values: int) -> None:
    """The backward direction runs from the last step inside the loop: equal to the causal GLA of the flipped
    sequence with its own gates, flipped back, forward and every gradient (the shared q, k, v's summed)."""
    q, k, v, g = gla_inputs(batch, heads, length, keys, values)
    g_back = (F.logsigmoid(torch.randn_like(g)) / 4).detach().requires_grad_()
    flip = lambda t: t.flip(2)  # noqa: E731
    expected = naive_recurrent_gla(q, k, v, g) + flip(naive_recurrent_gla(flip(q), flip(k), flip(v), flip(g_back)))
    assert_same_with_gradients(gla_both_ways_cpp(q, k, v, g, g_back), expected, [q, k, v, g, g_back])


@pytest.mark.parametrize("length", [23, 2, 1])
def test_ssd_hydra_is_both_directions_shifted_one_token(length: int) -> None:
    """Direction 1 runs from the last step inside the loop, u dt is formed in it, and the shifts live in the buffers'
    strides: equal to the causal SSD of u dt one token later plus the flipped causal SSD one token earlier, each
    direction with its own dt, forward and every gradient."""
    u = torch.randn(2, length, 3, 4, dtype=torch.float64, requires_grad=True)
    dt = F.softplus(torch.randn(2, 2, length, 3, dtype=torch.float64)).requires_grad_()
    _, a, b, c = (torch.stack(pair).detach().requires_grad_()
                  for pair in zip(ssd_inputs(2, length, 3, 4, 5), ssd_inputs(2, length, 3, 4, 5)))
    out = ssd_hydra_cpp(u, dt, a, b, c)
    causal = naive_ssd(u * dt[0, ..., None], a[0], b[0], c[0])
    anti_causal = naive_ssd(*(t.flip(1) for t in (u * dt[1, ..., None], a[1], b[1], c[1]))).flip(1)
    expected = torch.zeros_like(causal)
    expected[:, 1:] += causal[:, :-1]
    expected[:, :-1] += anti_causal[:, 1:]
    assert_same_with_gradients(out, expected, [u, dt, a, b, c])


def test_gradcheck_and_opcheck() -> None:
    gla = gla_inputs(2, 2, 6, 3, 4)
    ssd = ssd_inputs(2, 6, 2, 3, 2)
    assert torch.autograd.gradcheck(lambda *t: gla_recurrent_cpp(*t), gla)
    assert torch.autograd.gradcheck(lambda *t: ssd_recurrent_cpp(*t), ssd)
    g_back = gla_inputs(2, 2, 6, 3, 4)[3]
    assert torch.autograd.gradcheck(lambda *t: gla_both_ways_cpp(*t), (*gla, g_back))
    # The ops themselves take a leading direction axis; q, k, v shared by two directions as the mixer passes them.
    shared = [t.detach().unsqueeze(0).expand(2, *t.shape) for t in gla[:3]]
    gates = torch.stack([gla[3].detach(), g_back.detach()])
    torch.library.opcheck(torch.ops.mixerbench.gla_recurrent_cpp.default, (*shared, gates, 0.5, 16))
    both = [torch.stack([t.detach(), t.detach().flip(1)]) for t in ssd]
    torch.library.opcheck(torch.ops.mixerbench.ssd_recurrent_cpp.default, (*both, 32))
    u, dt = ssd[0].detach(), F.softplus(torch.randn(2, *ssd[1].shape, dtype=torch.float64))
    hydra = [u, dt, *both[1:]]
    torch.library.opcheck(torch.ops.mixerbench.ssd_hydra_cpp.default, (*hydra, 32))
    assert torch.autograd.gradcheck(lambda *t: ssd_hydra_cpp(*t), [t.detach().requires_grad_() for t in hydra])


def test_counters_charge_the_chunked_forms_macs() -> None:
    """One MAC count per mixer whichever implementation runs: the chunked form's at the chunk size given."""
    q, k, v, g = (t.detach() for t in gla_inputs(2, 3, 37, 4, 6))
    with FlopCounterMode(display=False) as counter:
        gla_recurrent_cpp(q, k, v, g, chunk_size=8)
    assert counter.get_total_flops() == 2 * 2 * chunk_gla_macs(3, 37, 4, 6, 8)
    x, a, b, c = (t.detach() for t in ssd_inputs(2, 37, 3, 5, 4))
    with FlopCounterMode(display=False) as counter:
        ssd_recurrent_cpp(x, a, b, c, chunk_size=16)
    assert counter.get_total_flops() == 2 * 2 * chunk_ssd_macs(37, 3, 5, 4, 16)
    with FlopCounterMode(display=False) as counter:  # both directions: twice the causal pass
        ssd_hydra_cpp(x, *(torch.stack([t, t]) for t in (a.exp(), a, b, c)), chunk_size=16)
    assert counter.get_total_flops() == 2 * 2 * 2 * chunk_ssd_macs(37, 3, 5, 4, 16)


@pytest.mark.parametrize("name", ["gla", "mamba2"])
def test_mixers_take_it_on_the_cpu_and_agree_with_the_pytorch_form(name: str) -> None:
    torch.manual_seed(0)
    mixer = create_mixer(name, 16, 2).double()
    reference = create_mixer(name, 16, 2, impl="chunk_torch").double()
    reference.load_state_dict(mixer.state_dict())
    x = torch.randn(2, 35, 16, dtype=torch.float64, requires_grad=True)
    out, expected = mixer(x, (5, 7)), reference(x, (5, 7))
    assert (mixer.impl, reference.impl) == ("cpp_loop", "chunk_torch")
    torch.testing.assert_close(out, expected)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *mixer.parameters()], grad_out)
    want = torch.autograd.grad(expected, [x, *reference.parameters()], grad_out)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", ["gla", "mamba2"])
def test_without_a_build_auto_falls_back_and_a_named_cpp_loop_says_why(name: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"mixers.{name}.cpp_unavailable_reason", lambda device: "no compiler here")
    mixer = create_mixer(name, 16, 2)
    mixer(torch.randn(1, 6, 16), (2, 3))
    assert mixer.impl == "chunk_torch"
    named = create_mixer(name, 16, 2, impl="cpp_loop")
    with pytest.raises(RuntimeError, match="impl='cpp_loop' cannot run here: no compiler here"):
        named(torch.randn(1, 6, 16), (2, 3))


def test_mamba2_refuses_an_unknown_impl() -> None:
    with pytest.raises(ValueError, match="unknown impl 'triton'; choose one of auto, chunk_torch, cpp_loop"):
        create_mixer("mamba2", 16, 2, impl="triton")


@pytest.mark.parametrize("name", ["gla", "mamba2"])
def test_compiled_training_runs_the_ops_and_agrees_with_eager(name: str) -> None:
    """Inductor on the CPU plans around the ops' fakes; the choice of implementation is a constant to Dynamo (no
    warning about the cached build it would otherwise trace into)."""
    import warnings

    torch.manual_seed(0)
    mixer = create_mixer(name, 32, 2)
    x = torch.randn(2, 16, 32, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(mixer)(x, (4, 4))
        (grad,) = torch.autograd.grad(out.square().sum(), x)
    assert mixer.impl == "cpp_loop"
    assert not [w for w in caught if "lru_cache" in str(w.message)]
    expected = mixer(x, (4, 4))
    (expected_grad,) = torch.autograd.grad(expected.square().sum(), x)
    # Inductor's fused element-wise kernels (softplus, logsigmoid, the norms) round unlike eager's, by CPU kind too.
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
