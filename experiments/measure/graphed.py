"""The `graphed` timing regime: a call captured once in a CUDA graph and replayed, so no Python or kernel launch
sits between its kernels (torch.cuda.CUDAGraph with static inputs, as PyTorch's whole-network capture recipe).

Eager and graphed rows of one point coexist (`timing_mode` is a key column); eager minus graphed at small N is the
launch floor that eager PyTorch pays. A call that cannot be captured raises `GraphUnavailable`, whose message
becomes the row's error: the sweep goes on.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .oom import is_out_of_memory

TIMING_MODES: tuple[str, ...] = ("eager", "graphed")
CAPTURE_WARMUP = 3  # eager calls on a side stream before capture (lazy init, autotuning, allocator pools)


class GraphUnavailable(RuntimeError):
    """This call cannot be timed graphed here; the message says why in one line."""


def check_graphable(device: torch.device) -> None:
    """Raises GraphUnavailable off CUDA, with the line a row and a log show."""
    if device.type != "cuda":
        raise GraphUnavailable(f"graphed timing needs CUDA (torch.cuda.CUDAGraph); this point runs on "
                               f"{device.type}: time it eager (timing_modes = [\"eager\"]) or run it on a GPU")


def capture(call: Callable[[], object], device: torch.device, warmup: Callable[[], object] | None = None,
            before_capture: Callable[[], object] | None = None) -> Callable[[], None]:
    """Captures `call()` in a CUDA graph and returns its replay.

    The replay holds the graph and its private memory pool: drop it (and empty the cache) before anything else
    measures memory.

    Args:
        call: what the graph records; its inputs must stay at the same addresses (static tensors).
        device: a CUDA device.
        warmup: run before capture on a side stream, as the capture recipe asks (default: `call`).
        before_capture: run after the warm-up, outside the graph. A training step passes `zero_grad(set_to_none=
            True)` here, as PyTorch's whole-network recipe does: backward then allocates each `.grad` inside the
            graph's pool and every replay rewrites it. Captured while the warm-up's gradients were still allocated,
            backward would record `grad += new` and every replay would add into them.

    Raises:
        GraphUnavailable: off CUDA, or when capture fails (an op that synchronises, a CPU tensor, a custom kernel
            that is not capturable); the message names the first error line.
    """
    check_graphable(device)
    warmup = warmup or call
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUP):
                warmup()
        torch.cuda.current_stream(device).wait_stream(side)
        if before_capture is not None:
            before_capture()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
    except GraphUnavailable:
        raise
    except Exception as error:  # noqa: BLE001 - an out-of-memory stays one; anything else cannot be captured
        if is_out_of_memory(error):
            raise
        first = (str(error).strip().splitlines() or [""])[0][:300]
        raise GraphUnavailable(f"CUDA graph capture failed: {type(error).__name__}: {first}") from None
    return graph.replay
