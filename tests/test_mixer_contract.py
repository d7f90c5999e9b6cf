"""The contract every registered mixer keeps; parametrised over the registry so a new mixer is tested at once."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import mixers
from margins import clearly_non_zero, largest
from mixers import TokenMixer, create_mixer, list_mixers, register_mixer
from mixers.base import INVARIANCES

DIM, HEADS = 32, 2
GRIDS = [(7, 9), (1, 1), (5, 13), (14, 14)]


def build(name: str, layer_idx: int = 0) -> TokenMixer:
    return create_mixer(name, DIM, HEADS, layer_idx=layer_idx).eval()


def test_builtins_are_registered() -> None:
    assert {"attention", "attention_naive", "swin", "linear", "mamba"} <= set(list_mixers())


@pytest.mark.parametrize("name", list_mixers())
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("layer_idx", [0, 1])
def test_shape_and_dtype_kept(name: str, grid: tuple[int, int], layer_idx: int) -> None:
    mixer = build(name, layer_idx)
    x = torch.randn(2, grid[0] * grid[1], DIM)
    out = mixer(x, grid)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", list_mixers())
def test_float64_kept(name: str) -> None:
    mixer = build(name).double()
    x = torch.randn(1, 12, DIM, dtype=torch.float64)
    assert mixer(x, (3, 4)).dtype == torch.float64


@pytest.mark.parametrize("name", list_mixers())
@pytest.mark.parametrize("layer_idx", [0, 1])
def test_gradient_reaches_every_parameter(name: str, layer_idx: int) -> None:
    mixer = build(name, layer_idx).double().train()
    x = torch.randn(2, 5 * 13, DIM, dtype=torch.float64, requires_grad=True)
    mixer(x, (5, 13)).square().sum().backward()
    grads = {"input": x.grad, **{pname: p.grad for pname, p in mixer.named_parameters()}}
    assert all(g is not None for g in grads.values()), [k for k, g in grads.items() if g is None]
    scale = largest(list(grads.values()))
    assert not [k for k, g in grads.items() if not clearly_non_zero(g, scale)], f"{name}: no gradient reaches them"


@pytest.mark.parametrize("name", list_mixers())
def test_batch_items_are_independent(name: str) -> None:
    mixer = build(name, layer_idx=1)
    grid = (7, 9)
    x = torch.randn(3, 63, DIM)
    together = mixer(x, grid)
    x_changed = x.clone()
    x_changed[1:] = torch.randn(2, 63, DIM)
    alone = mixer(x_changed, grid)
    torch.testing.assert_close(together[0], alone[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list_mixers())
def test_eval_is_deterministic(name: str) -> None:
    mixer = build(name)
    x = torch.randn(2, 63, DIM)
    torch.testing.assert_close(mixer(x, (7, 9)), mixer(x, (7, 9)), rtol=0, atol=0)


@pytest.mark.parametrize("name", list_mixers())
@pytest.mark.parametrize("grid", [(1, 1), (5, 13), (14, 14), (16, 16)])
@pytest.mark.parametrize("layer_idx", [0, 1])
def test_macs_match_flop_counter(name: str, grid: tuple[int, int], layer_idx: int) -> None:
    """The analytic formula equals what torch's counter sees (FLOPs = 2 x MACs), batch of one."""
    mixer = build(name, layer_idx)
    x = torch.randn(1, grid[0] * grid[1], DIM)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        mixer(x, grid)
    assert mixer.macs(grid) == counter.get_total_flops() // 2
    assert isinstance(mixer.macs(grid), int)


@pytest.mark.parametrize("name", list_mixers())
def test_mixer_has_no_grid_sized_state(name: str) -> None:
    """Nothing in the state dict depends on the grid, so one set of weights runs at every resolution."""
    mixer = build(name, layer_idx=1)
    before = {k: v.shape for k, v in mixer.state_dict().items()}
    for grid in [(3, 5), (9, 9)]:
        mixer(torch.randn(1, grid[0] * grid[1], DIM), grid)
    assert {k: v.shape for k, v in mixer.state_dict().items()} == before


@pytest.mark.parametrize("name", list_mixers())
def test_records_the_implementation_that_ran(name: str) -> None:
    mixer = build(name)
    mixer(torch.randn(1, 4, DIM), (2, 2))
    assert isinstance(mixer.impl, str) and mixer.impl


def test_unknown_mixer_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown mixer 'nope'.*attention.*swin"):
        create_mixer("nope", DIM, HEADS)


def test_bad_head_count_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="dim=30 is not divisible by num_heads=4"):
        create_mixer("attention", 30, 4)


def test_unknown_option_names_what_the_mixer_accepts() -> None:
    with pytest.raises(ValueError, match="no option.*windw_size.*accepts.*window_size"):
        create_mixer("swin", DIM, HEADS, windw_size=4)


def test_wrong_token_count_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"grid \(3, 3\)"):
        build("attention")(torch.randn(1, 10, DIM), (3, 3))


def test_registry_refuses_duplicates_and_non_mixers() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_mixer("attention")(mixers.get_mixer_class("linear"))
    with pytest.raises(TypeError, match="subclass of mixers.TokenMixer"):
        register_mixer("not_a_mixer")(torch.nn.Linear)


@pytest.mark.parametrize("name", list_mixers())
def test_inference_then_training(name: str) -> None:
    """Whatever a mixer caches during an inference_mode forward must still serve a training forward."""
    mixer = build(name, layer_idx=1)
    x = torch.randn(1, 63, DIM)
    with torch.inference_mode():
        mixer(x, (7, 9))
    mixer.train()(x.requires_grad_(), (7, 9)).sum().backward()


@pytest.mark.parametrize("name", list_mixers())
def test_declared_invariances_hold(name: str) -> None:
    """A mixer may declare what its output ignores (the reach test then excuses the parameter it hides), but only
    what is true: a declared per-channel shift must leave the output unchanged."""
    mixer = build(name).double()
    assert set(mixer.invariant_to) <= set(INVARIANCES), f"{name}: unknown invariance; known: {sorted(INVARIANCES)}"
    if "channel_shift" in mixer.invariant_to:
        x = torch.randn(2, 5 * 13, DIM, dtype=torch.float64)
        shift = 3.0 * torch.randn(DIM, dtype=torch.float64)
        # float64 round-off of values of order 10, far under a real dependence on the shift (order 1)
        torch.testing.assert_close(mixer(x + shift, (5, 13)), mixer(x, (5, 13)), rtol=0, atol=1e-9)
