"""gla's GPU fast path, fla's chunked GLA kernels, through a fake `fla` module: the dispatch, the layout fla takes,
the recorded `impl`, and a clean fallback to the PyTorch form on a CPU (issue 34 item 10). The kernels themselves
run only on a GPU (tests/test_gpu_paths.py)."""
from __future__ import annotations

import sys
import types

import pytest
import torch
from einops import rearrange

from mixers import create_mixer
from mixers.ops.gla import chunk_gla, fla_chunk
from mixers.ops.gla.fla_chunk import fla_unavailable_reason

DIM, HEADS, GRID = 16, 2, (3, 5)


@pytest.fixture
def fake_fla(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """An importable `fla.ops.gla.chunk_gla` with fla's signature and (B, T, H, K) layout, computing with the
    PyTorch reference and recording each call."""
    calls: list[dict] = []

    def chunk_gla_fake(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                       head_first=True):
        calls.append({"shape": tuple(q.shape), "head_first": head_first, "scale": scale,
                      "contiguous": all(t.is_contiguous() for t in (q, k, v, g))})
        assert not head_first  # this layout is (B, T, H, K)
        heads_first = (rearrange(t, "b l h d -> b h l d") for t in (q, k, v, g))
        return rearrange(chunk_gla(*heads_first, scale=scale), "b h l d -> b l h d"), None

    modules = {name: types.ModuleType(name) for name in ("fla", "fla.ops", "fla.ops.gla")}
    modules["fla.ops.gla"].chunk_gla = chunk_gla_fake
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    fla_chunk._fla_chunk_gla.cache_clear()
    yield calls
    fla_chunk._fla_chunk_gla.cache_clear()


def _pair(**options) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    mixer = create_mixer("gla", DIM, HEADS, **options)
    reference = create_mixer("gla", DIM, HEADS, impl="chunk_torch")
    reference.load_state_dict(mixer.state_dict())
    return mixer, reference


def test_auto_on_a_cpu_never_takes_fla_even_with_fla_installed(fake_fla: list[dict]) -> None:
    mixer, _ = _pair()
    mixer(torch.randn(2, GRID[0] * GRID[1], DIM), GRID)
    assert mixer.impl in ("cpp_loop", "chunk_torch") and fake_fla == []  # the CPU's forms
    assert "CUDA" in fla_unavailable_reason(torch.device("cpu"))
    assert fla_unavailable_reason(torch.device("cuda")) is None  # installed: CUDA would take it


def test_without_fla_cuda_falls_back_and_a_forced_fla_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fla", None)  # import fla raises ImportError
    fla_chunk._fla_chunk_gla.cache_clear()
    try:
        assert "not installed" in fla_unavailable_reason(torch.device("cuda"))
        mixer, _ = _pair(impl="fla")
        with pytest.raises(RuntimeError, match="impl='fla' cannot run here"):
            mixer(torch.randn(1, GRID[0] * GRID[1], DIM), GRID)
    finally:
        fla_chunk._fla_chunk_gla.cache_clear()


def test_where_fla_runs_the_mixer_dispatches_to_it_both_ways_and_records_it(
        fake_fla: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """One causal pass through fla for both directions (the backward one on the flipped sequence, stacked on the
    batch), in fla's layout; the result and its gradients match the PyTorch form, since the fake computes with it."""
    monkeypatch.setattr(fla_chunk, "fla_unavailable_reason", lambda device: None)
    monkeypatch.setattr("mixers.gla.fla_unavailable_reason", lambda device: None)
    mixer, reference = _pair(impl="fla")  # named: `auto` takes fla on CUDA only, and these tensors are the CPU's
    x = torch.randn(2, GRID[0] * GRID[1], DIM, requires_grad=True)
    out = mixer(x, GRID)
    assert mixer.impl == "fla_chunk"
    assert [c["shape"] for c in fake_fla] == [(2 * 2, 15, HEADS, mixer.head_k_dim)]
    assert all(c["contiguous"] and c["head_first"] is False for c in fake_fla)
    expected = reference(x, GRID)
    torch.testing.assert_close(out, expected)  # the same float32 arithmetic in the same order
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    (grad_ref,) = torch.autograd.grad(expected.square().sum(), x)
    torch.testing.assert_close(grad, grad_ref)


def test_fvcore_trace_counts_through_the_pytorch_form(fake_fla: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """fvcore sees no products inside fla's autograd Function: the trace takes chunk_torch; `impl` keeps what the
    measured calls ran."""
    from experiments.measure.counting import fvcore_macs

    monkeypatch.setattr("mixers.gla.fla_unavailable_reason", lambda device: None)
    mixer, reference = _pair(impl="fla")
    x = torch.randn(1, GRID[0] * GRID[1], DIM)
    mixer(x, GRID)
    calls = len(fake_fla)

    class Grid(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.inner(tokens, GRID)

    assert fvcore_macs(Grid(mixer), x) == fvcore_macs(Grid(reference), x)
    assert len(fake_fla) == calls and mixer.impl == "fla_chunk"


def test_signature_without_head_first_gets_no_head_first(fake_fla: list[dict]) -> None:
    """fla releases that dropped `head_first` (the layout is always (B, T, H, K) there) are called without it."""
    def newer(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        fake_fla.append({"shape": tuple(q.shape)})
        return v, None

    sys.modules["fla.ops.gla"].chunk_gla = newer
    fla_chunk._fla_chunk_gla.cache_clear()
    q = torch.randn(1, 2, 4, 3)
    out = fla_chunk.fla_chunk_gla(q, q, torch.randn(1, 2, 4, 5), q)
    assert out.shape == (1, 2, 4, 5) and fake_fla == [{"shape": (1, 4, 2, 3)}]
