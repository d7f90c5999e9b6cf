"""EagerOp (mixers/ops/eager_op.py): in plain eager the compiled kernels' Python functions run without the
dispatcher, with the same results as the ops; wherever something watches the dispatcher, the ops run."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import mixers.ops.eager_op as eager_op
from mixers import create_mixer, list_mixers
from mixers.ops.selective_scan import selective_scan
from mixers.ops.token_conv import depthwise_conv_tokens

DIM, HEADS, GRID = 32, 2, (5, 7)


def _step(name: str, watched: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A mixer's output and its input's and parameters' gradients, float64 on the CPU, through the ops where
    `watched` (the dispatcher watched, as under a counter) and the direct path otherwise."""
    if watched:
        monkeypatch.setattr(eager_op, "dispatcher_watched", lambda: True)
    torch.manual_seed(0)
    mixer = create_mixer(name, DIM, HEADS, layer_idx=1).double().train()
    x = torch.randn(2, GRID[0] * GRID[1], DIM, dtype=torch.float64, requires_grad=True)
    out = mixer(x, GRID)
    out.square().sum().backward()
    monkeypatch.undo()
    return out.detach(), [x.grad, *(p.grad for p in mixer.parameters())]


@pytest.mark.parametrize("name", list_mixers())
def test_the_direct_path_gives_the_ops_results(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same functions run, so the output is the same to the bit; a tensor that several paths reach sums their
    gradients in the order autograd's engine takes the nodes, which the two graphs need not share."""
    out_ops, grads_ops = _step(name, True, monkeypatch)
    out_direct, grads_direct = _step(name, False, monkeypatch)
    assert torch.equal(out_ops, out_direct)
    assert len(grads_ops) == len(grads_direct)
    for a, b in zip(grads_ops, grads_direct):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


def test_one_op_gives_the_same_bits_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    results = []
    for watched in (True, False):  # through the op, then the direct path
        if watched:
            monkeypatch.setattr(eager_op, "dispatcher_watched", lambda: True)
        inputs = _scan_inputs(True)
        z = torch.randn(2, 4, 9, generator=torch.Generator().manual_seed(1))
        y, _ = selective_scan(*inputs, D=torch.ones(4), z=z, delta_softplus=True, impl="cpp_loop")
        y.square().sum().backward()
        monkeypatch.undo()
        results.append([y.detach(), *(t.grad for t in inputs if t.requires_grad)])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def _scan_inputs(requires_grad: bool) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    u, delta = (torch.randn(2, 4, 9, requires_grad=requires_grad) for _ in range(2))
    A = -torch.rand(4, 3)
    B, C = (torch.randn(2, 3, 9, requires_grad=requires_grad) for _ in range(2))
    return u, delta, A, B, C


def test_plain_eager_runs_the_function_and_no_graph_without_gradients() -> None:
    y, impl = selective_scan(*_scan_inputs(True), delta_softplus=True, impl="cpp_loop")
    assert impl == "cpp_loop" and type(y.grad_fn).__name__ == "selective_scan_cppBackward"
    with torch.no_grad():
        assert selective_scan(*_scan_inputs(True), impl="cpp_loop")[0].grad_fn is None
    with torch.inference_mode():
        assert selective_scan(*_scan_inputs(False), impl="cpp_loop")[0].grad_fn is None


def test_the_direct_path_is_differentiable_once_as_the_op_is() -> None:
    x = torch.randn(2, 6, 3, requires_grad=True)
    weight = torch.randn(3, 1, 4, requires_grad=True)
    out = depthwise_conv_tokens(x, weight, None, 3, silu=True)
    (grad,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)  # a gradient with a graph
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:FutureWarning")  # fvcore traces so
def test_a_counter_the_profiler_and_a_trace_see_the_op() -> None:
    inputs = _scan_inputs(True)
    with FlopCounterMode(display=False) as counter:
        selective_scan(*inputs, impl="cpp_loop")
    assert counter.get_total_flops() > 0  # the op's flop formula ran: the direct path has no formula
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        selective_scan(*inputs, impl="cpp_loop")[0].sum().backward()
    names = {event.name for event in profile.events()}
    assert {"mixerbench::selective_scan_cpp", "mixerbench::selective_scan_cpp_bwd"} <= names
    assert "mixerbench::selective_scan_cpp" in str(torch.jit.trace(
        lambda u, delta, A, B, C: selective_scan(u, delta, A, B, C, impl="cpp_loop")[0],
        tuple(t.detach() for t in inputs)).graph)


def test_tensors_off_the_cpu_take_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    called = []
    op = eager_op.EagerOp(lambda *args: called.append("op"), lambda *args: called.append("impl"))
    op(torch.empty(1, device="meta"))
    op(torch.empty(1))
    assert called == ["op", "impl"]


def test_the_op_takes_its_gradient_from_eager_op() -> None:
    """EagerOp registers the op's autograd from the pair it builds its Function of: one gradient for both paths."""
    def triple(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        pass

    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * 5  # not the derivative (3), so the test sees that this function ran on both paths

    op = torch.library.custom_op("mixerbench_test::triple", triple, mutates_args=())
    call = eager_op.EagerOp(op, triple, setup_context, backward)
    x = torch.ones(4, requires_grad=True)
    (through_op,) = torch.autograd.grad(op(x).sum(), x)
    (direct,) = torch.autograd.grad(call(x).sum(), x)
    assert torch.equal(through_op, torch.full((4,), 5.0)) and torch.equal(direct, through_op)
