"""Global attention against independent references: the materialised form and torch.nn.MultiheadAttention."""
from __future__ import annotations

import pytest
import torch

from mixers import create_mixer

DIM, HEADS = 48, 3


def multihead_reference(attention: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """torch's own MultiheadAttention with our weights copied in (its in_proj is our fused qkv)."""
    mha = torch.nn.MultiheadAttention(DIM, HEADS, batch_first=True, dtype=x.dtype)
    with torch.no_grad():
        mha.in_proj_weight.copy_(attention.qkv.weight)
        mha.in_proj_bias.copy_(attention.qkv.bias)
        mha.out_proj.weight.copy_(attention.proj.weight)
        mha.out_proj.bias.copy_(attention.proj.bias)
    return mha(x, x, x, need_weights=False)[0]


@pytest.mark.parametrize("grid", [(1, 1), (5, 13), (14, 14)])
def test_sdpa_naive_and_multihead_agree(grid: tuple[int, int]) -> None:
    fused = create_mixer("attention", DIM, HEADS).double()
    naive = create_mixer("attention_naive", DIM, HEADS).double()
    naive.load_state_dict(fused.state_dict())
    x = torch.randn(2, grid[0] * grid[1], DIM, dtype=torch.float64)
    out = fused(x, grid)
    torch.testing.assert_close(naive(x, grid), out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(multihead_reference(fused, x), out, rtol=1e-10, atol=1e-10)
    assert naive.impl == "naive" and fused.impl.startswith("sdpa")


def test_naive_shares_the_state_dict() -> None:
    fused = create_mixer("attention", DIM, HEADS)
    naive = create_mixer("attention_naive", DIM, HEADS)
    assert fused.state_dict().keys() == naive.state_dict().keys()


def test_gradients_agree() -> None:
    fused = create_mixer("attention", DIM, HEADS).double()
    naive = create_mixer("attention_naive", DIM, HEADS).double()
    naive.load_state_dict(fused.state_dict())
    x = torch.randn(2, 35, DIM, dtype=torch.float64, requires_grad=True)
    (g_fused,) = torch.autograd.grad(fused(x, (5, 7)).sin().sum(), x)
    (g_naive,) = torch.autograd.grad(naive(x, (5, 7)).sin().sum(), x)
    torch.testing.assert_close(g_fused, g_naive, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mixer", ["attention", "swin"])
def test_a_compiled_call_names_its_kernel_as_an_eager_call_does(mixer: str) -> None:
    """A compiled sweep point never calls its model eagerly, and its row reads `impl` after compiled calls only: a
    compiled call must set the label itself (a guard that skipped the query under torch.compile, to save the graph
    break, left the initial label in those rows)."""
    import torch._dynamo

    torch._dynamo.reset()
    x, grid = torch.randn(2, 49, DIM), (7, 7)
    eager, compiled = create_mixer(mixer, DIM, HEADS), create_mixer(mixer, DIM, HEADS)
    eager(x, grid)
    torch.compile(compiled)(x, grid)
    assert compiled.impl == eager.impl
