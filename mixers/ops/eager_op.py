"""A custom op called without the dispatcher's round trip through Python where nothing watches the dispatcher.

The compiled CPU kernels are `torch.library.custom_op`s so that torch.compile, the counters (`FlopCounterMode`,
fvcore's jit trace) and the profiler see each one as an op with its name, its fake and its MACs. In plain eager
autograd that costs a call into the dispatcher, back into Python, and the op's autograd wrapper, per call and again
for its backward op: tens of microseconds each, about a twentieth of a Mamba training step at the micro preset's 16
tokens (issue 33's note has the A/B). `EagerOp` calls the same Python functions directly there (a gradient, where
one is wanted, through one `torch.autograd.Function` of the op's own setup_context and backward), and the op
wherever anything could be watching: torch.compile, jit tracing, a dispatch or function mode, functorch's
transforms, the profiler (whose names the profile bench reads), or a tensor not on the CPU. Both paths run the same
functions, so an op's results are the same bits either way (tests/test_eager_op.py); a tensor that several ops'
gradients reach may sum them in another order, as autograd's engine orders the two graphs' nodes.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def dispatcher_watched() -> bool:
    """Whether something may be tracing, counting or profiling the ops called now."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._is_torch_function_mode_enabled() or torch._C._autograd._profiler_enabled()
            or torch._C._functorch.peek_interpreter_stack() is not None)


class EagerOp:
    """`op`, or in plain eager on the CPU `impl` itself, through an autograd Function where a gradient is wanted.

    Args:
        op: the custom op as `torch.library.custom_op` returned it (a `CustomOpDef`; calling it calls the op).
        impl: the Python function the op was registered with.
        setup_context, backward: the op's gradient, for an op that has one (None for a backward op). EagerOp
            registers them with the op (`register_autograd`) and builds its Function from the same two, so the op
            and the direct path cannot differ in them. The Function's backward is once differentiable, as the op's
            is (its backward op has no gradient).
    """

    def __init__(self, op: Callable, impl: Callable, setup_context: Callable | None = None,
                 backward: Callable | None = None) -> None:
        self.op, self.impl = op, impl
        self.function = None
        if backward is not None:
            op.register_autograd(backward, setup_context=setup_context)

            def forward(ctx, *args: object) -> object:
                output = impl(*args)
                setup_context(ctx, args, output)
                return output

            # forward taking ctx, not a separate setup_context: with one, every apply binds its arguments through
            # inspect.signature, which took most of what skipping the dispatcher saves
            # named after the op, so a grad_fn says which kernel it is (CustomOpDef keeps the name private; the
            # function's name where it is gone)
            self.function = type(getattr(op, "_name", impl.__name__), (torch.autograd.Function,), {
                "forward": staticmethod(forward),
                "backward": staticmethod(once_differentiable(backward)),
            })

    def __call__(self, *args: object) -> object:
        tensors = [a for a in args if isinstance(a, Tensor)]
        if dispatcher_watched() or any(t.device.type != "cpu" for t in tensors):
            return self.op(*args)
        if self.function is not None and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self.function.apply(*args)
        with torch.no_grad():  # as the op's own call: its outputs never carry a graph
            return self.impl(*args)
